package kubernetes

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// hostilePod is a sandbox's Pod whose gate copied msg (the sandbox-writable status.json)
// into its termination message; the main container ended with the kubelet's reason and
// its own termination message mainMsg (its /dev/termination-log, also the workload's).
func hostilePod(msg, mainReason, mainMsg string, started, gateEnded time.Time) *corev1.Pod {
	return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{
		{Name: containerGate, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			Reason: "Completed", Message: msg, StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(gateEnded)}}},
		{Name: containerMain, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 1, Reason: mainReason, Message: mainMsg, StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(gateEnded)}}},
	}}}
}

// TestAttackPrimaryForgedFinalStatus: the primary's final status on Kubernetes is the
// gate's copy of the agent's status.json, a file in the run dir the sandbox's workload
// can write. A workload that forges it must not decide more than its own command could:
// a message too long is not parsed, an unknown state is no final status, a reason the
// platform gives (OOMKilled, Killed, Vanished, Evicted) is Error, restarts stay within
// the spec's limit, the message is short printable text, the end time lies within the
// container's run, and the kubelet's OOMKilled stands over whatever the file says.
func TestAttackPrimaryForgedFinalStatus(t *testing.T) {
	started := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	ended := started.Add(30 * time.Minute)
	const limit = 4
	for _, tc := range []struct {
		name, msg, mainReason, mainMsg string
		reason                         string
		code                           string // "" none
		restarts                       int
		message                        string // exact
		at                             time.Time
	}{
		{name: "honest", msg: `{"state":"MAIN_STATE_FAILED","exitCode":3,"restartCount":4,"reason":"RestartLimit","message":"gave up","finishedAt":"` + ended.Add(-time.Minute).Format(time.RFC3339Nano) + `"}`,
			mainReason: "Error", reason: "RestartLimit", code: "3", restarts: 4, message: "gave up", at: ended.Add(-time.Minute)},
		{name: "kubelet's seconds are cut", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","finishedAt":"` + ended.Add(700*time.Millisecond).Format(time.RFC3339Nano) + `"}`,
			mainReason: "Completed", reason: "Completed", code: "0", at: ended.Add(700 * time.Millisecond)},
		{name: "huge", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","message":"` + strings.Repeat("x", 1<<20) + `"}`,
			mainReason: "Error", mainMsg: "plain words", reason: "Error", code: "1", message: "plain words", at: ended},
		{name: "just over the cap", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","message":"` + strings.Repeat("x", maxTerminationMessage) + `"}`,
			mainReason: "Error", reason: "Error", code: "1", at: ended},
		{name: "invalid UTF-8", msg: "{\"state\":\"MAIN_STATE_COMPLETED\",\"exitCode\":0,\"reason\":\"Completed\",\"message\":\"\xff\xfe\"}",
			mainReason: "Error", mainMsg: "\xff\xfeoops", reason: "Error", code: "1", message: "\uFFFDoops", at: ended},
		{name: "control characters", msg: `{"state":"MAIN_STATE_FAILED","exitCode":2,"reason":"Error","message":"\u001b[2J\u001b]0;pwned\u0007"}`,
			mainReason: "Error", mainMsg: "\x1b[31mred", reason: "Error", code: "2", at: ended},
		{name: "bidi override", msg: `{"state":"MAIN_STATE_FAILED","exitCode":2,"reason":"Error","message":"ok\u202egnp.exe"}`,
			mainReason: "Error", reason: "Error", code: "2", at: ended},
		{name: "long message is clipped", msg: `{"state":"MAIN_STATE_FAILED","exitCode":2,"reason":"Error","message":"` + strings.Repeat("é", 1500) + `"}`,
			mainReason: "Error", reason: "Error", code: "2", message: textclip.Clip(strings.Repeat("é", 1500), agent.MaxStatusText), at: ended},
		{name: "unknown state", msg: `{"state":"MAIN_STATE_BOGUS","exitCode":0,"reason":"Completed"}`,
			mainReason: "Error", reason: "Error", code: "1", at: ended},
		{name: "unknown state number", msg: `{"state":99,"exitCode":0,"reason":"Completed"}`,
			mainReason: "Error", reason: "Error", code: "1", at: ended},
		{name: "not final", msg: `{"state":"MAIN_STATE_RUNNING","exitCode":0,"reason":"Completed"}`,
			mainReason: "Error", reason: "Error", code: "1", at: ended},
		{name: "claims OOMKilled", msg: `{"state":"MAIN_STATE_FAILED","exitCode":137,"reason":"OOMKilled","message":"memory limit exceeded"}`,
			mainReason: "Error", reason: "Error", code: "137", message: "memory limit exceeded", at: ended},
		{name: "claims Killed by the platform", msg: `{"state":"MAIN_STATE_STOPPED","reason":"Killed","message":"the platform killed it"}`,
			mainReason: "Error", reason: "Error", message: "the platform killed it", at: ended},
		{name: "claims Vanished", msg: `{"state":"MAIN_STATE_FAILED","exitCode":1,"reason":"Vanished"}`,
			mainReason: "Error", reason: "Error", code: "1", at: ended},
		{name: "claims Evicted", msg: `{"state":"MAIN_STATE_FAILED","exitCode":1,"reason":"Evicted"}`,
			mainReason: "Error", reason: "Error", code: "1", at: ended},
		{name: "restarts beyond the limit", msg: `{"state":"MAIN_STATE_FAILED","exitCode":1,"restartCount":2147483647,"reason":"RestartLimit"}`,
			mainReason: "Error", reason: "RestartLimit", code: "1", restarts: limit, at: ended},
		{name: "negative restarts", msg: `{"state":"MAIN_STATE_FAILED","exitCode":1,"restartCount":-5,"reason":"Error"}`,
			mainReason: "Error", reason: "Error", code: "1", at: ended},
		{name: "finished before it started", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","finishedAt":"1971-01-01T00:00:00Z"}`,
			mainReason: "Completed", reason: "Completed", code: "0", at: ended},
		{name: "finished in the future", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","finishedAt":"2999-01-01T00:00:00Z"}`,
			mainReason: "Completed", reason: "Completed", code: "0", at: ended},
		{name: "finished after the gate ended", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","finishedAt":"` + ended.Add(10*time.Second).Format(time.RFC3339Nano) + `"}`,
			mainReason: "Completed", reason: "Completed", code: "0", at: ended},
		{name: "the kubelet's OOMKilled stands", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","message":"all fine"}`,
			mainReason: "OOMKilled", reason: "OOMKilled", code: "0", message: "memory limit exceeded", at: ended},
		{name: "unknown fields", msg: `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","platformReason":"Evicted","pid":1}`,
			mainReason: "Completed", reason: "Completed", code: "0", at: ended},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := exitOf(hostilePod(tc.msg, tc.mainReason, tc.mainMsg, started, ended), false, limit, false)
			code := ""
			if ex.ExitCode != nil {
				code = strconv.Itoa(int(*ex.ExitCode))
			}
			if ex.Reason != tc.reason || code != tc.code || ex.Restarts != tc.restarts || ex.Message != tc.message || !ex.At.Equal(tc.at) {
				t.Errorf("exit = %+v (code %q), want reason %s code %q restarts %d message %q at %s", ex, code, tc.reason, tc.code, tc.restarts, tc.message, tc.at)
			}
			if !textclip.AllPrintable(ex.Message) || len(ex.Message) > agent.MaxStatusText {
				t.Errorf("message %q: not short printable text", ex.Message)
			}
		})
	}
}

// TestAttackPrimaryForgedFinalStatusMulti: a group's primary is reported by
// ContainerStatuses from the same copy, held to the primary container's restart limit.
func TestAttackPrimaryForgedFinalStatusMulti(t *testing.T) {
	started := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	pod := hostilePod(`{"state":"MAIN_STATE_FAILED","exitCode":9,"restartCount":999,"reason":"OOMKilled","message":"\u001b[2J"}`, "Error", "", started, started.Add(time.Minute))
	b := &Backend{sandboxes: map[string]*sandbox{}}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "i", RestartLimit: 2},
		Sidecars: []runtime.Container{{Name: "db", Image: "i", RestartLimit: 3}}}
	s := &sandbox{id: "x", spec: spec, pod: pod, changed: make(chan struct{}), done: make(chan struct{})}
	b.sandboxes["x"] = s
	sts, err := b.ContainerStatuses(t.Context(), "x")
	if err != nil || len(sts) == 0 {
		t.Fatalf("statuses %+v, %v", sts, err)
	}
	if st := sts[0]; st.Reason != "Error" || st.Restarts != 2 || st.Message != "" || st.ExitCode == nil || *st.ExitCode != 9 {
		t.Errorf("primary from a forged status: %+v, want Error, exit 9, 2 restarts (its limit), no message", st)
	}
}

// FuzzParseAgentStatus: whatever a sandbox leaves in a termination message, the parsed
// and bounded status says only what an agent could.
func FuzzParseAgentStatus(f *testing.F) {
	for _, s := range []string{
		`{"state":"MAIN_STATE_FAILED","exitCode":3,"restartCount":2,"reason":"RestartLimit","message":"gave up","finishedAt":"2026-01-01T00:00:00Z"}`,
		`{"state":"MAIN_STATE_COMPLETED","reason":"OOMKilled","restartCount":-1}`,
		`{"state":"MAIN_STATE_STOPPED","message":"\u001b[2J\u202e"}`,
		`{"state":7}`, `not json`, ``, "{\"message\":\"\xff\"}",
	} {
		f.Add(s, 6, false)
	}
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ended := started.Add(time.Hour)
	f.Fuzz(func(t *testing.T, msg string, limit int, oom bool) {
		st := parseAgentStatus(msg)
		if st == nil {
			return
		}
		if len(msg) > maxTerminationMessage {
			t.Fatalf("parsed a message of %d bytes", len(msg))
		}
		fin := boundedFinal(st, limit, kubeletView{oom: oom, started: started, finished: ended})
		if fin == nil {
			if finalState(st) {
				t.Fatal("a final status was refused")
			}
			return
		}
		if !agent.IsReason(fin.GetReason()) && !(oom && fin.GetReason() == "OOMKilled") {
			t.Errorf("reason %q", fin.GetReason())
		}
		if r := fin.GetRestartCount(); r < 0 || int(r) > max(limit, 0) {
			t.Errorf("restarts %d, limit %d", r, limit)
		}
		if m := fin.GetMessage(); len(m) > agent.MaxStatusText || !textclip.AllPrintable(m) || !utf8.ValidString(m) {
			t.Errorf("message %q", m)
		}
		if fin.FinishedAt != nil {
			if at := fin.FinishedAt.AsTime(); at.Before(started) || at.After(ended.Add(time.Second)) {
				t.Errorf("finished at %s, outside the run", at)
			}
		}
		if fin.StartedAt != nil {
			if at := fin.StartedAt.AsTime(); at.Before(started) || at.After(ended.Add(time.Second)) {
				t.Errorf("started at %s, outside the run", at)
			}
		}
	})
}

// TestAttackSidecarLiveStatusBounded: a sidecar's agent runs in the sandbox, so what its
// watch says while the container runs is held as its final status is: restarts within the
// container's limit, an agent's reason (a claimed OOMKilled is Error), a bounded
// printable message. The kubelet's OOMKilled of the ended container stands over it.
func TestAttackSidecarLiveStatusBounded(t *testing.T) {
	b := &Backend{sandboxes: map[string]*sandbox{}}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "i", RestartLimit: 6},
		Sidecars: []runtime.Container{{Name: "db", Image: "i", RestartLimit: 3}}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1", ContainerStatuses: []corev1.ContainerStatus{
		{Name: containerMain, State: running}, {Name: "db", State: running},
	}}}
	code := int32(137)
	s := &sandbox{id: "x", spec: spec, pod: pod, changed: make(chan struct{}), done: make(chan struct{}),
		agentStatus: map[string]*agentv1.StatusResponse{"db": {State: agentv1.MainState_MAIN_STATE_RESTARTING,
			RestartCount: 1 << 30, ExitCode: &code, Reason: "OOMKilled", Message: "\x1b]0;owned\x07" + strings.Repeat("z", 1<<16)}}}
	b.sandboxes["x"] = s
	db := func() runtime.ContainerStatus {
		t.Helper()
		sts, err := b.ContainerStatuses(t.Context(), "x")
		if err != nil || len(sts) != 2 {
			t.Fatalf("statuses %+v, %v", sts, err)
		}
		return sts[1]
	}
	if st := db(); st.State != runtime.ContainerRunning || st.Restarts != 3 || st.Reason != "Error" || st.Message != "" {
		t.Errorf("a forged live status: %+v, want running, 3 restarts (the limit), Error, no message", st)
	}
	s.agentStatus["db"].Message = strings.Repeat("ü", 2000)
	if st := db(); len(st.Message) > agent.MaxStatusText || !textclip.AllPrintable(st.Message) {
		t.Errorf("a long live message: %d bytes, want at most %d printable", len(st.Message), agent.MaxStatusText)
	}
	pod.Status.ContainerStatuses[1].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}
	s.agentStatus["db"] = &agentv1.StatusResponse{State: agentv1.MainState_MAIN_STATE_COMPLETED, Reason: "Completed"}
	if st := db(); st.Reason != "OOMKilled" {
		t.Errorf("a sidecar the kubelet saw OOM-killed, its agent saying Completed: %+v, want OOMKilled", st)
	}
}
