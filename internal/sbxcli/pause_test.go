package sbxcli

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// In the fake, a sandbox tagged "runc" cannot be checkpointed, and a fork of one tagged
// "flaky" fails for its second fork.

func hasTag(sb *sandboxv1.Sandbox, tag string) bool {
	for _, t := range sb.GetSpec().GetTags() {
		if t == tag {
			return true
		}
	}
	return false
}

func (s *fakeState) PauseSandbox(_ context.Context, req *connect.Request[statev1.PauseSandboxRequest]) (*connect.Response[statev1.PauseSandboxResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.pauseReqs = append(s.f.pauseReqs, proto.Clone(req.Msg).(*statev1.PauseSandboxRequest))
	sb, ok := s.f.sandboxes[req.Msg.GetSandboxId()]
	switch {
	case !ok:
		return nil, apierr.Newf(apierr.SandboxNotFound, "sandbox %q not found", req.Msg.GetSandboxId())
	case sb.GetStatus().GetState() != sandboxv1.State_STATE_RUNNING:
		return nil, apierr.Newf(apierr.SandboxNotRunning, "sandbox %q is %s", sb.GetSandboxId(), sb.GetStatus().GetState())
	case hasTag(sb, "runc") && req.Msg.GetReleaseResources():
		return nil, apierr.Newf(apierr.CheckpointNotSupported, "runtime class runc cannot be checkpointed; gvisor can")
	}
	sb.Status.State = sandboxv1.State_STATE_PAUSED
	release := !hasTag(sb, "runc") && (req.Msg.ReleaseResources == nil || req.Msg.GetReleaseResources())
	ps := &statev1.PauseStatus{SandboxId: sb.GetSandboxId(), ResourcesReleased: release, AutoResume: req.Msg.AutoResume == nil || req.Msg.GetAutoResume(),
		PausedAt: timestamppb.New(fakeCreated.Add(time.Minute))}
	if release {
		ps.CheckpointBytes = 3 << 20
	}
	return connect.NewResponse(&statev1.PauseSandboxResponse{Status: ps}), nil
}

func (s *fakeState) ResumeSandbox(_ context.Context, req *connect.Request[statev1.ResumeSandboxRequest]) (*connect.Response[statev1.ResumeSandboxResponse], error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	sb, ok := s.f.sandboxes[req.Msg.GetSandboxId()]
	if !ok {
		return nil, apierr.Newf(apierr.SandboxNotFound, "sandbox %q not found", req.Msg.GetSandboxId())
	}
	s.f.resumeReqs = append(s.f.resumeReqs, proto.Clone(req.Msg).(*statev1.ResumeSandboxRequest))
	sb.Status.State = sandboxv1.State_STATE_RUNNING
	res := &statev1.ResumeSandboxResponse{SandboxId: sb.GetSandboxId(), Deadline: timestamppb.New(fakeCreated.Add(10 * time.Minute)), RunnerId: sb.GetStatus().GetRunnerId()}
	// Not allowed where it is: it moves to the first runner listed.
	if ids := req.Msg.GetRunnerIds(); len(ids) > 0 && !slices.Contains(ids, res.RunnerId) {
		res.MovedFrom, res.RunnerId = res.RunnerId, ids[0]
		sb.Status.RunnerId = ids[0]
	}
	return connect.NewResponse(res), nil
}

func (s *fakeState) ForkSandbox(_ context.Context, req *connect.Request[statev1.ForkSandboxRequest]) (*connect.Response[statev1.ForkSandboxResponse], error) {
	s.f.mu.Lock()
	s.f.forkReqs = append(s.f.forkReqs, proto.Clone(req.Msg).(*statev1.ForkSandboxRequest))
	sb, ok := s.f.sandboxes[req.Msg.GetSandboxId()]
	s.f.mu.Unlock()
	switch {
	case !ok:
		return nil, apierr.Newf(apierr.SandboxNotFound, "sandbox %q not found", req.Msg.GetSandboxId())
	case hasTag(sb, "runc"):
		return nil, apierr.Newf(apierr.CheckpointNotSupported, "runtime class runc cannot be checkpointed; gvisor can")
	}
	res := &statev1.ForkSandboxResponse{}
	for i := range int(req.Msg.GetCount()) {
		id := fmt.Sprintf("%s-fork-%d", sb.GetSandboxId(), i+1)
		if i == 1 && hasTag(sb, "flaky") {
			res.Forks = append(res.Forks, &statev1.Fork{SandboxId: id, Error: &statev1.ForkError{Code: "UNAVAILABLE", Reason: apierr.RunnerUnavailable, Message: "the runner went away"}})
			continue
		}
		runner := sb.GetStatus().GetRunnerId()
		if ids := req.Msg.GetRunnerIds(); len(ids) > 0 {
			runner = ids[i%len(ids)]
		}
		s.f.add(id).Status.RunnerId = runner
		res.Forks = append(res.Forks, &statev1.Fork{SandboxId: id, RunnerId: runner})
	}
	return connect.NewResponse(res), nil
}

func TestSbxPauseResume(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	out, errs, code := f.sbx("", "pause", "sbx-1")
	if code != 0 || out != "sbx-1 paused: checkpointed, CPU and memory released (checkpoint 3 MiB); exec, files and endpoint traffic resume it; its lifetime counts while paused\n" {
		t.Errorf("pause: %d %q %q", code, out, errs)
	}
	if r := f.pauseReqs[0]; r.ReleaseResources != nil || r.AutoResume != nil {
		t.Errorf("plain pause sent %v", r)
	}
	// ls and get show it paused.
	if out, _, _ := f.sbx("", "ls"); !strings.Contains(out, "sbx-1  paused") {
		t.Errorf("ls: %q", out)
	}
	if out, _, _ := f.sbx("", "get", "sbx-1"); !regexp.MustCompile(`State:\s+paused\n`).MatchString(out) || !strings.Contains(out, "sbx resume sbx-1") {
		t.Errorf("get: %q", out)
	}
	if _, errs, code := f.sbx("", "pause", "sbx-1"); code == 0 || !strings.Contains(errs, "CWSANDBOX_SANDBOX_NOT_RUNNING") {
		t.Errorf("second pause: %d %q", code, errs)
	}
	if out, errs, code := f.sbx("", "resume", "sbx-1"); code != 0 || out != "sbx-1 running on local, until 2026-01-02T03:10:00Z\n" {
		t.Errorf("resume: %d %q %q", code, out, errs)
	}
	if out, _, _ := f.sbx("", "get", "sbx-1"); !regexp.MustCompile(`State:\s+running\n`).MatchString(out) || strings.Contains(out, "sbx resume") {
		t.Errorf("get after resume: %q", out)
	}

	// --freeze --no-auto-resume, as JSON.
	out, errs, code = f.sbx("", "-o", "json", "pause", "sbx-1", "--freeze", "--no-auto-resume")
	var got map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got["resourcesReleased"] != false || got["autoResume"] != false || got["sandboxId"] != "sbx-1" || got["pausedAt"] != "2026-01-02T03:01:00Z" {
		t.Errorf("pause --freeze -o json: %d %q %q", code, out, errs)
	}
	if r := f.pauseReqs[len(f.pauseReqs)-1]; r.ReleaseResources == nil || r.GetReleaseResources() || r.AutoResume == nil || r.GetAutoResume() {
		t.Errorf("--freeze --no-auto-resume sent %v", r)
	}
	if _, _, code := f.sbx("", "resume", "sbx-1"); code != 0 {
		t.Fatal("resume failed")
	}

	// runc: --release refused, naming the reason; a plain pause freezes.
	f.add("sbx-runc", "runc")
	if _, errs, code := f.sbx("", "pause", "sbx-runc", "--release"); code == 0 || !strings.Contains(errs, "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED") || !strings.Contains(errs, "gvisor") {
		t.Errorf("--release on runc: %d %q", code, errs)
	}
	if r := f.pauseReqs[len(f.pauseReqs)-1]; r.ReleaseResources == nil || !r.GetReleaseResources() {
		t.Errorf("--release sent %v", r)
	}
	if out, _, code := f.sbx("", "pause", "sbx-runc"); code != 0 || !strings.Contains(out, "frozen (memory kept and still counted)") {
		t.Errorf("pause on runc: %d %q", code, out)
	}

	n := len(f.pauseReqs)
	for _, args := range [][]string{{"pause"}, {"pause", "sbx-1", "--release", "--freeze"}, {"resume"}} {
		if _, errs, code := f.sbx("", args...); code == 0 || errs == "" {
			t.Errorf("%v: exit %d %q, want an error", args, code, errs)
		}
	}
	if len(f.pauseReqs) != n {
		t.Error("a bad pause command reached the API")
	}
	if _, errs, code := f.sbx("", "resume", "nope"); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("resume of an unknown sandbox: %d %q", code, errs)
	}
}

func TestSbxFork(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	out, errs, code := f.sbx("", "fork", "sbx-1", "-n", "3", "--request-id", "r-1")
	if code != 0 || out != "sbx-1-fork-1 on local\nsbx-1-fork-2 on local\nsbx-1-fork-3 on local\n" {
		t.Errorf("fork -n 3: %d %q %q", code, out, errs)
	}
	if r := f.forkReqs[0]; r.GetCount() != 3 || r.GetRequestId() != "r-1" || len(r.GetRunnerIds()) != 0 {
		t.Errorf("fork request %v", r)
	}
	if out, _, code := f.sbx("", "fork", "sbx-1"); code != 0 || out != "sbx-1-fork-1 on local\n" || f.forkReqs[1].GetCount() != 1 || f.forkReqs[1].GetRequestId() == "" {
		t.Errorf("fork: %d %q, request %v", code, out, f.forkReqs[1])
	}

	// One of three fails: the others on stdout, the failure on stderr, exit 1.
	f.add("sbx-flaky", "flaky")
	out, errs, code = f.sbx("", "fork", "sbx-flaky", "-n", "3")
	if code != 1 || out != "sbx-flaky-fork-1 on local\nsbx-flaky-fork-3 on local\n" || !strings.Contains(errs, "fork sbx-flaky-fork-2: the runner went away") || !strings.Contains(errs, "1 of 3 forks failed") {
		t.Errorf("partial fork: %d %q %q", code, out, errs)
	}
	out, _, code = f.sbx("", "-o", "json", "fork", "sbx-flaky", "-n", "2")
	var got struct {
		Forks []struct {
			SandboxID string `json:"sandboxId"`
			Error     *struct{ Code, Reason, Message string }
		}
	}
	if code != 1 || json.Unmarshal([]byte(out), &got) != nil || len(got.Forks) != 2 || got.Forks[0].SandboxID != "sbx-flaky-fork-1" || got.Forks[0].Error != nil ||
		got.Forks[1].Error == nil || got.Forks[1].Error.Reason != "CWSANDBOX_RUNNER_UNAVAILABLE" || got.Forks[1].Error.Code != "unavailable" {
		t.Errorf("fork -o json: %d %q", code, out)
	}

	f.add("sbx-runc", "runc")
	if _, errs, code := f.sbx("", "fork", "sbx-runc"); code == 0 || !strings.Contains(errs, "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED") {
		t.Errorf("fork on runc: %d %q", code, errs)
	}
	n := len(f.forkReqs)
	for _, bad := range []string{"0", "101", "-2"} {
		if _, errs, code := f.sbx("", "fork", "sbx-1", "-n", bad); code == 0 || errs == "" {
			t.Errorf("-n %s: exit %d", bad, code)
		}
	}
	if len(f.forkReqs) != n {
		t.Error("a bad fork count reached the API")
	}
}

func TestSbxResumeAndForkOnRunners(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	// Resume on another runner: the runners are sent, the move is shown.
	if _, _, code := f.sbx("", "pause", "sbx-1"); code != 0 {
		t.Fatal("pause failed")
	}
	out, errs, code := f.sbx("", "resume", "sbx-1", "--runner", "r2", "--runner", "r3")
	if code != 0 || out != "sbx-1 running on r2 (moved from local), until 2026-01-02T03:10:00Z\n" {
		t.Errorf("resume --runner: %d %q %q", code, out, errs)
	}
	if r := f.resumeReqs[len(f.resumeReqs)-1]; !slices.Equal(r.GetRunnerIds(), []string{"r2", "r3"}) {
		t.Errorf("resume request %v", r)
	}
	// Where it is: not moved; as JSON.
	if _, _, code := f.sbx("", "pause", "sbx-1"); code != 0 {
		t.Fatal("pause failed")
	}
	out, _, code = f.sbx("", "-o", "json", "resume", "sbx-1", "--runner", "r2")
	var got map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got["runnerId"] != "r2" || got["movedFrom"] != nil || got["sandboxId"] != "sbx-1" {
		t.Errorf("resume -o json: %d %q", code, out)
	}
	if _, _, code := f.sbx("", "pause", "sbx-1"); code != 0 {
		t.Fatal("pause failed")
	}
	out, _, code = f.sbx("", "-o", "json", "resume", "sbx-1", "--runner", "r4")
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got["runnerId"] != "r4" || got["movedFrom"] != "r2" {
		t.Errorf("resume -o json, moved: %d %q", code, out)
	}
	if r := f.resumeReqs[len(f.resumeReqs)-1]; !slices.Equal(r.GetRunnerIds(), []string{"r4"}) {
		t.Errorf("resume request %v", r)
	}

	// Fork onto other runners: each fork's runner shown.
	out, errs, code = f.sbx("", "fork", "sbx-1", "-n", "2", "--runner", "r5", "--runner", "r6")
	if code != 0 || out != "sbx-1-fork-1 on r5\nsbx-1-fork-2 on r6\n" {
		t.Errorf("fork --runner: %d %q %q", code, out, errs)
	}
	if r := f.forkReqs[len(f.forkReqs)-1]; !slices.Equal(r.GetRunnerIds(), []string{"r5", "r6"}) || r.GetCount() != 2 {
		t.Errorf("fork request %v", r)
	}
	out, _, code = f.sbx("", "-o", "json", "fork", "sbx-1", "--runner", "r7")
	var forks struct {
		Forks []struct {
			SandboxID string `json:"sandboxId"`
			RunnerID  string `json:"runnerId"`
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &forks) != nil || len(forks.Forks) != 1 || forks.Forks[0].RunnerID != "r7" {
		t.Errorf("fork -o json --runner: %d %q", code, out)
	}
}
