package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestParsePulled(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		ok   bool
		hit  bool
		want time.Duration
		size int64
	}{
		{`Container image "localhost/sandboxd/busybox:latest" already present on machine`, true, true, 0, 0},
		{`Successfully pulled image "docker.io/library/busybox:latest" in 2.133s (2.133s including waiting). Image size: 2167089 bytes.`, true, false, 2133 * time.Millisecond, 2167089},
		{`Container image "x" already present on machine and can be accessed by the pod`, true, true, 0, 0}, // v1.33 with KubeletEnsureSecretPulledImages
		{`Container image "x" is not present with pull policy of Never`, false, false, 0, 0},
		{`Successfully pulled image "b" in 1s (1s including waiting). Image size: 99999999999999999999999 bytes.`, true, false, time.Second, 0}, // size out of range: dropped, the pull kept
		{`Successfully pulled image "b" in 1s (1s including waiting). Image size: -5 bytes.`, true, false, time.Second, 0},
		{`Successfully pulled image "b" in 1s (1s including waiting). Image size: 17592186044417 bytes.`, true, false, time.Second, 0}, // 16 TiB + 1
		{`Successfully pulled image "b" in 1s (1s including waiting). Image size: 0x10 bytes.`, true, false, time.Second, 0},
		{`Successfully pulled image "a\" in 9h" in 2s (2s including waiting). Image size: 7 bytes.`, true, false, 2 * time.Second, 7}, // a quote in the reference (escaped by %q)
		{`Successfully pulled image "busybox" in 812.5ms (1.2s including waiting)`, true, false, 812500 * time.Microsecond, 0},
		{`Successfully pulled image "busybox" in 1m3.5s (1m3.5s including waiting). Image size: 1 bytes.`, true, false, 63500 * time.Millisecond, 1},
		{`Successfully pulled image "busybox" in -1s (1s including waiting)`, false, false, 0, 0},
		{`Successfully pulled image "busybox" in 1000000h (x)`, false, false, 0, 0},
		{`Successfully pulled image "busybox" in soon`, false, false, 0, 0},
		{`Successfully pulled image "busybox"`, false, false, 0, 0},
		{`Pulling image "busybox"`, false, false, 0, 0},
		{`Successfully pulled image "` + strings.Repeat("a", 2000) + `" in 1s`, false, false, 0, 0}, // past the parsed bound
	} {
		p, ok := parsePulled(tc.msg)
		if ok != tc.ok || ok && (p.hit != tc.hit || p.d != tc.want || p.size != tc.size) {
			t.Errorf("parsePulled(%.60q) = %+v, %v; want hit %v d %v size %d, %v", tc.msg, p, ok, tc.hit, tc.want, tc.size, tc.ok)
		}
	}
}

var eventSeq atomic.Int64

func pulledEvent(pod, uid, field, msg string, at time.Time) corev1.Event {
	return corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%d", pod, eventSeq.Add(1)), Namespace: "sbx"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "sbx", Name: pod, UID: types.UID(uid), FieldPath: field},
		Reason:         "Pulled", Message: msg, Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "kubelet"},
		FirstTimestamp: metav1.NewTime(at), LastTimestamp: metav1.NewTime(at),
	}
}

// TestPullsOf: one pull per sandbox container of the Pod (this UID), by the kubelet; the
// agent's containers, other Pods' events and other sources' left out.
func TestPullsOf(t *testing.T) {
	at := time.Unix(1700000000, 0)
	hit := `Container image "x" already present on machine`
	miss := `Successfully pulled image "y" in 1.5s (1.5s including waiting)`
	evs := []corev1.Event{
		pulledEvent("sbx-a", "u1", "spec.containers{gate}", hit, at),
		pulledEvent("sbx-a", "u1", "spec.initContainers{install}", hit, at),
		pulledEvent("sbx-a", "u1", "spec.containers{sandbox}", miss, at),
		pulledEvent("sbx-a", "u1", "spec.containers{sandbox}", hit, at), // a second one of the same container
		pulledEvent("sbx-a", "u1", "spec.initContainers{c0-init}", hit, at),
		pulledEvent("sbx-a", "old-uid", "spec.containers{side}", hit, at), // an earlier Pod of the name
		pulledEvent("sbx-b", "u1", "spec.containers{side}", hit, at),
		pulledEvent("sbx-a", "u1", "spec.containers", hit, at),
		pulledEvent("sbx-a", "u1", "spec.containers{c2-side}", "garbage", at),
	}
	forged := pulledEvent("sbx-a", "u1", "spec.containers{c3-x}", hit, at)
	forged.Source.Component = "someone"
	evs = append(evs, forged)
	started := pulledEvent("sbx-a", "u1", "spec.containers{c2-side}", hit, at)
	started.Reason = "Started"
	evs = append(evs, started)
	byName := pulledEvent("sbx-a", "u1", "spec.containers{not-in-spec}", hit, at) // by the kubelet, of no container of the Pod
	evs = append(evs, byName)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-a", UID: "u1"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "install"}, {Name: "c0-init"}},
		Containers:     []corev1.Container{{Name: "gate"}, {Name: "sandbox"}, {Name: "side"}, {Name: "c2-side"}, {Name: "c3-x"}},
	}}
	got := pullsOf(evs, pod, nil)
	var desc []string
	for _, p := range got {
		desc = append(desc, fmt.Sprintf("%s hit=%v %v", p.container, p.hit, p.d))
	}
	want := []string{"sandbox hit=false 1.5s", "c0-init hit=true 0s"}
	if strings.Join(desc, "; ") != strings.Join(want, "; ") {
		t.Errorf("pullsOf = %q, want %q", desc, want)
	}
}

// TestPullsOfFailed: a container whose image could not be had (failed) is a failed pull
// from its earliest Pulling to its earliest "Failed to pull image" event, as the kubelet
// wrote them on the test cluster (v1.32.13, containerd 1.6); without both, or with
// times out of order, none; a container not in failed is never a failed pull, and its
// Pulled event wins over failures before it (a retry that succeeded).
func TestPullsOfFailed(t *testing.T) {
	at := time.Unix(1700000000, 0)
	ev := func(field, reason, msg string, first time.Time) corev1.Event {
		e := pulledEvent("sbx-f", "uf", field, msg, first)
		e.Reason = reason
		e.LastTimestamp = metav1.NewTime(first.Add(14 * time.Second)) // aggregated retries
		e.Count = 2
		return e
	}
	const (
		ref     = `"127.0.0.1:1/nope/x:1"`
		failMsg = `Failed to pull image ` + ref + `: failed to pull and unpack image ` + ref + `: failed to resolve reference ` + ref + `: failed to do request: Head "http://127.0.0.1:1/v2/nope/x/manifests/1": dial tcp 127.0.0.1:1: connect: connection refused`
	)
	evs := []corev1.Event{
		ev("spec.containers{sandbox}", "Failed", "Error: ErrImagePull", at.Add(time.Second)),
		ev("spec.containers{sandbox}", "Failed", failMsg, at.Add(3*time.Second)),
		ev("spec.containers{sandbox}", "Pulling", `Pulling image `+ref, at),
		ev("spec.containers{sandbox}", "BackOff", `Back-off pulling image `+ref, at.Add(4*time.Second)),
		ev("spec.containers{sandbox}", "Failed", "Error: ImagePullBackOff", at.Add(4*time.Second)),
		ev("spec.containers{sandbox}", "Pulling", `Pulling image `+ref, at.Add(10*time.Second)), // a later retry's (not aggregated)
		// c1: failed before Pulling (clock or forgery): none.
		ev("spec.containers{c1-a}", "Pulling", `Pulling image "a"`, at.Add(5*time.Second)),
		ev("spec.containers{c1-a}", "Failed", `Failed to pull image "a": x`, at.Add(2*time.Second)),
		// c2: no Pulling event: none.
		ev("spec.containers{c2-b}", "Failed", `Failed to pull image "b": x`, at),
		// c3: not among the failed containers: its failure events say nothing.
		ev("spec.containers{c3-c}", "Pulling", `Pulling image "c"`, at),
		ev("spec.containers{c3-c}", "Failed", `Failed to pull image "c": x`, at.Add(time.Second)),
		// c4: failed, then pulled on a retry: the pull.
		ev("spec.containers{c4-d}", "Pulling", `Pulling image "d"`, at),
		ev("spec.containers{c4-d}", "Failed", `Failed to pull image "d": x`, at.Add(time.Second)),
		ev("spec.containers{c4-d}", "Pulled", `Successfully pulled image "d" in 1.5s (1.5s including waiting). Image size: 10 bytes.`, at.Add(9*time.Second)),
		// c5: took more than a day: none.
		ev("spec.containers{c5-e}", "Pulling", `Pulling image "e"`, at),
		ev("spec.containers{c5-e}", "Failed", `Failed to pull image "e": x`, at.Add(25*time.Hour)),
		// c6: Failed events that are not pull failures.
		ev("spec.containers{c6-f}", "Pulling", `Pulling image "f"`, at),
		ev("spec.containers{c6-f}", "Failed", `Error: ErrImagePull`, at.Add(time.Second)),
		ev("spec.containers{c6-f}", "Failed", `Failed to pull image "f"`, at.Add(time.Second)),
		// the gate's own failure is not a sandbox's.
		ev("spec.containers{gate}", "Pulling", `Pulling image "agent"`, at),
		ev("spec.containers{gate}", "Failed", `Failed to pull image "agent": x`, at.Add(time.Second)),
	}
	forged := ev("spec.containers{c7-g}", "Failed", `Failed to pull image "g": x`, at.Add(time.Second))
	forged.Source.Component, forged.ReportingController = "not-the-kubelet", ""
	evs = append(evs, ev("spec.containers{c7-g}", "Pulling", `Pulling image "g"`, at), forged)
	var spec []corev1.Container
	failed := map[string]bool{}
	for _, n := range []string{containerGate, containerMain, "c1-a", "c2-b", "c3-c", "c4-d", "c5-e", "c6-f", "c7-g"} {
		spec = append(spec, corev1.Container{Name: n})
		if n != "c3-c" {
			failed[n] = true
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-f", UID: "uf"}, Spec: corev1.PodSpec{Containers: spec}}
	var desc []string
	for _, p := range pullsOf(evs, pod, failed) {
		desc = append(desc, fmt.Sprintf("%s failed=%v %v size=%d", p.container, p.failed, p.d, p.size))
	}
	want := []string{"sandbox failed=true 3s size=0", "c4-d failed=false 1.5s size=10"}
	if strings.Join(desc, "; ") != strings.Join(want, "; ") {
		t.Errorf("pullsOf = %q, want %q", desc, want)
	}
}

// TestPullsOfHostile: events anyone allowed to create events could write (a source named
// kubelet, this Pod's UID) move the metrics only within bounds: one pull per container of
// the spec whatever their number, messages past 1 KiB not parsed beyond it, no
// duration over a day, no size over 16 TiB.
func TestPullsOfHostile(t *testing.T) {
	at := time.Unix(1700000000, 0)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-h", UID: "uh"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerGate}, {Name: containerMain}}}}
	var evs []corev1.Event
	for i := range 300 {
		evs = append(evs, pulledEvent("sbx-h", "uh", "spec.containers{sandbox}", fmt.Sprintf(`Successfully pulled image "x" in %dh (x). Image size: %d bytes.`, 20+i, 1<<50), at))
	}
	evs = append(evs,
		pulledEvent("sbx-h", "uh", "spec.containers{"+strings.Repeat("s", 100)+"}", `Container image "x" already present on machine`, at),
		pulledEvent("sbx-h", "uh", "spec.containers{sandbox}", `Successfully pulled image "`+strings.Repeat(`x" in 1s `, 200)+`" in 1s (x). Image size: 5 bytes.`, at),
		pulledEvent("sbx-h", "uh", "spec.containers{sandbox}", `Container image "`+strings.Repeat("\x00", 5000)+`" already present on machine`, at),
	)
	got := pullsOf(evs, pod, map[string]bool{containerMain: true})
	if len(got) != 1 {
		t.Fatalf("pullsOf = %+v, want one pull", got)
	}
	if p := got[0]; p.container != containerMain || p.d > maxPullDuration || p.size != 0 || p.failed {
		t.Errorf("pull = %+v: want the first bounded one (20h, no size)", p)
	}
}

// FuzzParsePullEvents: no message makes the parsers panic or step out of their bounds.
func FuzzParsePullEvents(f *testing.F) {
	for _, s := range []string{
		`Container image "localhost/sandboxd/busybox:latest" already present on machine`,
		`Successfully pulled image "docker.io/library/busybox:latest" in 2.133s (2.133s including waiting). Image size: 2167089 bytes.`,
		`Pulling image "127.0.0.1:1/nope/x:1"`,
		`Failed to pull image "127.0.0.1:1/nope/x:1": failed to pull and unpack image`,
		`Error: ErrImagePull`, `Back-off pulling image "x"`, "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		if p, ok := parsePulled(msg); ok {
			if p.d < 0 || p.d > maxPullDuration || p.size < 0 || p.size > counters.MaxReportedImageSize || p.hit && (p.d != 0 || p.size != 0) {
				t.Fatalf("parsePulled(%q) = %+v", msg, p)
			}
		}
		_ = isPulling(msg)
		_ = isPullFailure(msg)
	})
}

func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	return rec
}

func delta(before map[string]float64, key string) float64 {
	return counters.Values()[key] - before[key]
}

// TestReportCreate: a create's steps become child spans of its span (schedule, runtime,
// agent, and an image.pull per sandbox container from the kubelet's events, placed
// within the runtime step), and its pulls count in the image pull series (hit and miss
// by the events, the agent's image not counted).
func TestReportCreate(t *testing.T) {
	rec := recordSpans(t)
	b, cs := newFakeBackend(t, Config{})
	t0 := time.Now().Truncate(time.Second)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sbx-s1", Namespace: "sbx", UID: "u1"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerGate}, {Name: containerMain}, {Name: "c2-side"}}},
	}
	for _, ev := range []corev1.Event{
		pulledEvent("sbx-s1", "u1", "spec.containers{gate}", `Successfully pulled image "agent" in 3s (3s including waiting)`, t0),
		pulledEvent("sbx-s1", "u1", "spec.containers{sandbox}", `Successfully pulled image "busybox" in 400ms (400ms including waiting). Image size: 5 bytes.`, t0.Add(time.Second)),
		pulledEvent("sbx-s1", "u1", "spec.containers{c2-side}", `Container image "busybox" already present on machine`, t0.Add(time.Second)),
	} {
		if _, err := cs.CoreV1().Events("sbx").Create(t.Context(), &ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st := &createSteps{created: t0, scheduled: t0.Add(100 * time.Millisecond), pinging: t0.Add(300 * time.Millisecond),
		running: t0.Add(1200 * time.Millisecond), ready: t0.Add(1100 * time.Millisecond)}
	s := &sandbox{id: "s1", steps: st, pod: pod}

	ctx, parent := otel.Tracer("test").Start(context.Background(), "runner.start")
	before := counters.Values()
	var err error
	b.reportCreate(ctx, s, pod, &err)
	parent.End()
	eventually(t, "the pulls recorded", func() bool {
		return delta(before, `cwsandbox_image_pulls_total{cache="hit",result="ok"}`) == 1 &&
			delta(before, `cwsandbox_image_pulls_total{cache="miss",result="ok"}`) == 1
	})
	if d := delta(before, `cwsandbox_image_pull_duration_seconds_sum{cache="miss",result="ok"}`); d < 0.399 || d > 0.401 {
		t.Errorf("miss duration sum grew by %v, want 0.4", d)
	}
	if d := delta(before, `cwsandbox_kubelet_reported_image_size_bytes_total`); d != 5 {
		t.Errorf("reported image size grew by %v, want the kubelet's 5 bytes", d)
	}
	if d := delta(before, `cwsandbox_image_pull_bytes_total`); d != 0 {
		t.Errorf("bytes counted: %v (the kubelet does not say what it fetched)", d)
	}
	if s.steps != nil {
		t.Error("steps kept after the create")
	}

	type got struct {
		start, end time.Time
		attrs      map[attribute.Key]attribute.Value
	}
	spans := map[string][]got{}
	eventually(t, "the image.pull spans", func() bool {
		spans = map[string][]got{}
		for _, sp := range rec.Ended() {
			if sp.Parent().SpanID() != parent.SpanContext().SpanID() {
				continue
			}
			g := got{start: sp.StartTime(), end: sp.EndTime(), attrs: map[attribute.Key]attribute.Value{}}
			for _, a := range sp.Attributes() {
				g.attrs[a.Key] = a.Value
			}
			spans[sp.Name()] = append(spans[sp.Name()], g)
		}
		return len(spans[stepPull]) == 2
	})
	for name, want := range map[string][2]time.Time{
		stepSchedule: {st.created, st.scheduled},
		stepRuntime:  {st.scheduled, st.ready}, // the agent answered before the container was seen running
		stepAgent:    {st.pinging, st.ready},
	} {
		if g := spans[name]; len(g) != 1 || !g[0].start.Equal(want[0]) || !g[0].end.Equal(want[1]) {
			t.Errorf("span %s = %+v, want one from %v to %v", name, g, want[0], want[1])
		}
	}
	for _, g := range spans[stepPull] {
		if g.start.Before(st.scheduled) || g.end.After(st.ready) {
			t.Errorf("image.pull %v..%v outside the runtime step %v..%v", g.start, g.end, st.scheduled, st.ready)
		}
		c, hit := g.attrs["sandboxd.container"].AsString(), g.attrs["sandboxd.cache_hit"].AsBool()
		switch {
		case c == containerMain && !hit:
			if d := g.end.Sub(g.start); d != 400*time.Millisecond {
				t.Errorf("image.pull of %s lasts %v, want the kubelet's 400ms", c, d)
			}
		case c == "c2-side" && hit:
		default:
			t.Errorf("image.pull span of container %q hit %v", c, hit)
		}
	}
}

// TestReportCreateFailedPull: a create that failed on a pull counts it by the kubelet's
// reason (bounded: another reason is "other"); the agent's image's failure is not a
// sandbox's pull.
func TestReportCreateFailedPull(t *testing.T) {
	b, cs := newFakeBackend(t, Config{})
	b.eventsWait = []time.Duration{0}
	t0 := time.Now().Truncate(time.Second)
	for _, ev := range []corev1.Event{
		pulledEvent("sbx-s2", "u2", "spec.containers{sandbox}", `Pulling image "nope"`, t0),
		pulledEvent("sbx-s2", "u2", "spec.containers{sandbox}", `Failed to pull image "nope": not found`, t0.Add(2*time.Second)),
		pulledEvent("sbx-s2", "u2", "spec.containers{gate}", `Pulling image "agent"`, t0),
		pulledEvent("sbx-s2", "u2", "spec.containers{gate}", `Failed to pull image "agent": not found`, t0.Add(time.Second)),
	} {
		ev.Reason, _, _ = strings.Cut(ev.Message, " ")
		if ev.Reason != "Pulling" {
			ev.Reason = "Failed"
		}
		if _, err := cs.CoreV1().Events("sbx").Create(t.Context(), &ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waiting := func(name, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "secret message"}}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sbx-s2", Namespace: "sbx", UID: "u2"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerGate}, {Name: containerMain}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			waiting(containerGate, "ImagePullBackOff"), waiting(containerMain, "ErrImagePull"),
		}, InitContainerStatuses: []corev1.ContainerStatus{waiting("c0-init", "ImageInspectError"), waiting("c1-x", "ContainerCreating")}},
	}
	s := &sandbox{id: "s2", steps: &createSteps{created: time.Now()}, pod: pod}
	before := counters.Values()
	err := errors.New("pull failed")
	b.reportCreate(context.Background(), s, pod, &err)
	for key, want := range map[string]float64{
		`cwsandbox_image_pulls_total{cache="miss",result="error"}`:        2,
		`cwsandbox_image_pull_failures_total{reason="ErrImagePull"}`:      1,
		`cwsandbox_image_pull_failures_total{reason="ImageInspectError"}`: 1,
		`cwsandbox_image_pull_failures_total{reason="ImagePullBackOff"}`:  0,
	} {
		if d := delta(before, key); d != want {
			t.Errorf("%s grew by %v, want %v", key, d, want)
		}
	}
	// The sandbox container's failed pull took 2 s by the kubelet's events (the gate's is not counted).
	eventually(t, "the failed pull's duration", func() bool {
		return delta(before, `cwsandbox_image_pull_duration_seconds_count{cache="miss",result="error"}`) == 1
	})
	if d := delta(before, `cwsandbox_image_pull_duration_seconds_sum{cache="miss",result="error"}`); d != 2 {
		t.Errorf("failed pull duration sum grew by %v, want 2", d)
	}
	counters.ImagePullFailed("made up by someone")
	if d := delta(before, `cwsandbox_image_pull_failures_total{reason="other"}`); d != 1 {
		t.Errorf("an unknown reason counted as other %v times, want 1", d)
	}
}

const summaryJSON = `{"node":{"nodeName":"n1","cpu":{"usageCoreNanoSeconds":99}},"pods":[
 {"podRef":{"name":"sbx-s1","namespace":"sbx","uid":"u1"},"cpu":{"usageCoreNanoSeconds":5000000000},
  "containers":[
   {"name":"gate","cpu":{"usageCoreNanoSeconds":1000000000},"memory":{"usageBytes":4096,"workingSetBytes":4000}},
   {"name":"sandbox","cpu":{"usageCoreNanoSeconds":2500000000},"memory":{"usageBytes":10485760,"workingSetBytes":9000000}},
   {"name":"c2-side","cpu":{"time":"2026-12-06T07:20:03Z","usageCoreNanoSeconds":1500000},"memory":{"workingSetBytes":1048576}}]},
 {"podRef":{"name":"sbx-s1","namespace":"other","uid":"u9"},"containers":[{"name":"sandbox","cpu":{"usageCoreNanoSeconds":7}}]},
 {"podRef":{"name":"sbx-s3","namespace":"sbx","uid":"u3"},"containers":[{"name":"sandbox"}]}
]}`

func TestParseSummary(t *testing.T) {
	got, err := parseSummary(strings.NewReader(summaryJSON), "sbx")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["u9"] != nil {
		t.Fatalf("pods = %v: want this namespace's two", got)
	}
	if u := got["u1"]["sandbox"]; u.CPUUsec != 2500000 || u.MemoryBytes != 10485760 {
		t.Errorf("sandbox container = %+v", u)
	}
	if len(got["u3"]) != 0 {
		t.Errorf("a container without CPU time kept: %v", got["u3"])
	}
	if _, err := parseSummary(strings.NewReader(`{"pods":[`), "sbx"); err == nil {
		t.Error("a cut summary parsed")
	}
}

// running puts a sandbox whose Pod runs on node into b.
func running(b *Backend, id, node string, uid types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sandboxes[id] = &sandbox{id: id, changed: make(chan struct{}), done: make(chan struct{}), pod: &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: uid},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}}
}

// TestUsageFromKubelet: a running sandbox's usage is its containers' (not the agent's
// gate) from its node's kubelet summary, read once per node within statsTTL; a kubelet
// that cannot be read gives no usage (ErrNotFound, never a made-up number) and is not
// asked again at once; node names that are not names are never asked for.
func TestUsageFromKubelet(t *testing.T) {
	var calls atomic.Int32
	var fail atomic.Bool
	var (
		mu    sync.Mutex
		asked []string
	)
	b, _ := newFakeBackend(t, Config{NodeStats: func(ctx context.Context, node string) (io.ReadCloser, error) {
		calls.Add(1)
		mu.Lock()
		asked = append(asked, node)
		mu.Unlock()
		if fail.Load() {
			return nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes/proxy"}, node, errors.New("no"))
		}
		return io.NopCloser(strings.NewReader(summaryJSON)), nil
	}, NodeMetrics: func(ctx context.Context, node string) (io.ReadCloser, error) {
		return nil, errors.New("no cAdvisor here")
	}})
	running(b, "s1", "n1", "u1")
	running(b, "s3", "n1", "u3")
	running(b, "s4", "../n1", "u1")
	running(b, "s5", "n2", "u1")

	u, err := b.Usage("s1")
	if err != nil {
		t.Fatal(err)
	}
	if want := (runtime.Usage{CPUUsec: 2501500, MemoryBytes: 11534336, At: time.Date(2026, 12, 6, 7, 20, 3, 0, time.UTC)}); u.CPUUsec != want.CPUUsec || u.MemoryBytes != want.MemoryBytes || !u.At.Equal(want.At) {
		t.Errorf("usage = %+v, want %+v (the sandbox's containers, not the gate; usage bytes, else the working set; the latest sample time)", u, want)
	}
	if u.MemoryPeakBytes != 0 {
		t.Errorf("a memory peak %d without cAdvisor's metrics", u.MemoryPeakBytes)
	}
	if _, err := b.Usage("s3"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("usage of a Pod without container CPU = %v, want ErrNotFound", err)
	}
	if _, err := b.Usage("s4"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("usage on node ../n1 = %v, want ErrNotFound", err)
	}
	if _, err := b.Usage("nope"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("usage of an unknown sandbox = %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("kubelet asked %d times (%v), want once for n1 within its TTL", n, asked)
	}

	fail.Store(true)
	if _, err := b.Usage("s5"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("usage from a kubelet that refuses = %v, want ErrNotFound", err)
	}
	if _, err := b.Usage("s5"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("usage from a kubelet that refuses = %v, want ErrNotFound", err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("kubelet asked %d times (%v), want a refusing node asked once, then held off", n, asked)
	}
	// A Pod not running has no usage, and its node is not asked.
	b.mu.Lock()
	b.sandboxes["s1"].pod.Status.Phase = corev1.PodPending
	b.mu.Unlock()
	if _, err := b.Usage("s1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("usage of a pending Pod = %v", err)
	}
}

// cadvisorSample is the kubelet's /metrics/cadvisor as the test cluster (v1.32.13,
// containerd 1.6, cgroupfs, cgroup v1) serves it, cut to the memory peak lines of one Pod
// (u1) and a few others: the pod's and its containers' cgroups, no container labels.
const cadvisorSample = `# HELP container_memory_max_usage_bytes Maximum memory usage recorded in bytes
# TYPE container_memory_max_usage_bytes gauge
container_memory_max_usage_bytes{container="",id="/",image="",name="",namespace="",pod=""} 2.4495251456e+10 1796575360346
container_memory_max_usage_bytes{container="",id="/sandboxd-k8s/kubepods/besteffort/podu1",image="",name="",namespace="sbx",pod="sbx-s1"} 4.079616e+06 1796575353419
container_memory_max_usage_bytes{container="",id="/sandboxd-k8s/kubepods/besteffort/podu1/72f4289f906a5f17ce9a9fe732a9848febe6807f191426caffc53a58c3e4abf9",image="",name="",namespace="",pod=""} 3.006464e+06 1796575352980
container_memory_max_usage_bytes{container="",id="/sandboxd-k8s/kubepods/besteffort/podu1/7d06d8905b16de17cfc02fe8e03bf5b7601d54d0bda47b2f4eec33a65f3e79a9",image="",name="",namespace="",pod=""} 3.817472e+06 1796575361147
container_memory_max_usage_bytes{container="gate",id="/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu1.slice/cri-containerd-aaaa.scope",image="x",name="aaaa",namespace="sbx",pod="sbx-s1"} 1e+06
container_memory_max_usage_bytes{container="c2-side",id="/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu1.slice/cri-containerd-bbbb.scope",image="x",name="bbbb",namespace="sbx",pod="sbx-s1",} 2e+07
container_memory_max_usage_bytes{container="",id="/sandboxd-k8s/kubepods/besteffort/podu9/cccc",image="",name="",namespace="",pod=""} 7e+06
container_memory_usage_bytes{container="",id="/sandboxd-k8s/kubepods/besteffort/podu1/dddd",image="",name="",namespace="",pod=""} 9e+06
`

func TestParsePeaks(t *testing.T) {
	got, err := parsePeaks(strings.NewReader(cadvisorSample))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"72f4289f906a5f17ce9a9fe732a9848febe6807f191426caffc53a58c3e4abf9": 3006464,
		"7d06d8905b16de17cfc02fe8e03bf5b7601d54d0bda47b2f4eec33a65f3e79a9": 3817472,
		"aaaa": 1e6, "bbbb": 2e7, "cccc": 7e6,
	}
	if len(got) != len(want) {
		t.Errorf("peaks = %v, want %v (containers' cgroups only)", got, want)
	}
	for k, v := range want {
		if got[k].bytes != v {
			t.Errorf("peak of %s = %+v, want %d", k, got[k], v)
		}
	}
	// A line past the bound is skipped, the lines around it still read; hostile lines are
	// left out.
	long := "x_other_family{" + strings.Repeat("a", 3*maxCadvisorLine) + "} 1\n"
	good := maxUsagePrefix + `id="/kubepods/podu1/aaaa"} 1000000` + "\n"
	if got, err := parsePeaks(strings.NewReader(good + long + strings.Replace(good, "aaaa", "bbbb", 1))); err != nil || got["aaaa"].bytes != 1e6 || got["bbbb"].bytes != 1e6 {
		t.Errorf("around an over-long line: %v %v", got, err)
	}
	if got, err := parsePeaks(strings.NewReader(good + long[:len(long)-1])); err != nil || len(got) != 1 {
		t.Errorf("an over-long last line: %v %v", got, err)
	}
	for _, line := range []string{
		maxUsagePrefix + `id="/p/podu1/abcd"} NaN`,
		maxUsagePrefix + `id="/p/podu1/abcd"} -5`,
		maxUsagePrefix + `id="/p/podu1/abcd"} 1e300`,
		maxUsagePrefix + `id="/p/podu1/abcd"} 1.5`,
		maxUsagePrefix + `id="/p/podu1/abcd"} 0`,
		maxUsagePrefix + `id="/p/podu1/abcd} 5`,
		maxUsagePrefix + `id="/p/podu1/ABCD"} 5`,
		maxUsagePrefix + `id="/p/podu1/` + strings.Repeat("a", 129) + `"} 5`,
		maxUsagePrefix + `id="/p/podu1/x-abcd.scope"} 5`,
		maxUsagePrefix + `id="/p/podu1/abcd\q"} 5`,
		maxUsagePrefix + `id="/p/podu1/abcd"5`,
		maxUsagePrefix + `}` + ` 5`,
	} {
		if got, err := parsePeaks(strings.NewReader(line + "\n")); err != nil || len(got) != 0 {
			t.Errorf("parsePeaks(%.80q) = %v, %v; want nothing", line, got, err)
		}
	}
	many := strings.Builder{}
	for i := range maxPeaks + 10 {
		fmt.Fprintf(&many, "%sid=\"/p/podu1/%x\"} 5\n", maxUsagePrefix, i+1)
	}
	if got, err := parsePeaks(strings.NewReader(many.String())); err != nil || len(got) != maxPeaks {
		t.Errorf("%d peaks kept (%v), want the bound %d", len(got), err, maxPeaks)
	}
}

// TestUsagePeak: a sandbox's memory peak is the sum of its running sandbox containers'
// cgroup peaks (not the gate's), found by the container IDs of the Pod's status under
// the Pod's own cgroup; none when one container has no peak or its cgroup lies under
// another Pod; never below the usage.
func TestUsagePeak(t *testing.T) {
	b, _ := newFakeBackend(t, Config{
		NodeStats: func(ctx context.Context, node string) (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(summaryJSON)), nil
		},
		NodeMetrics: func(ctx context.Context, node string) (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(cadvisorSample)), nil
		},
	})
	runningC := func(id string, statuses ...string) {
		running(b, id, "n1", "u1")
		b.mu.Lock()
		defer b.mu.Unlock()
		pod := b.sandboxes[id].pod
		for i := 0; i < len(statuses); i += 2 {
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: statuses[i], ContainerID: statuses[i+1],
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})
		}
	}
	main := "containerd://72f4289f906a5f17ce9a9fe732a9848febe6807f191426caffc53a58c3e4abf9"
	runningC("p1", containerGate, "containerd://aaaa", containerMain, main, "c2-side", "containerd://bbbb")
	runningC("p2", containerMain, main, "c2-side", "containerd://eeee")                                            // no peak for c2-side
	runningC("p3", containerMain, main, "c2-side", "containerd://cccc")                                            // c2-side's cgroup is another Pod's
	runningC("p4", containerMain, "containerd://7d06d8905b16de17cfc02fe8e03bf5b7601d54d0bda47b2f4eec33a65f3e79a9") // below the usage
	for id, want := range map[string]int64{"p1": 3006464 + 2e7, "p2": 0, "p3": 0, "p4": 11534336} {
		u, err := b.Usage(id)
		if err != nil {
			t.Fatal(err)
		}
		if u.MemoryPeakBytes != want {
			t.Errorf("%s: peak %d, want %d (usage %d)", id, u.MemoryPeakBytes, want, u.MemoryBytes)
		}
	}
}

// FuzzParseMaxUsage: no cAdvisor line makes the parser panic or step out of its bounds.
func FuzzParseMaxUsage(f *testing.F) {
	for _, l := range strings.Split(cadvisorSample, "\n") {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, line string) {
		id, v, ok := parseMaxUsage(line)
		if ok && (id == "" || len(id) > maxCgroupPath || v < 0 || v > maxStatsValue) {
			t.Fatalf("parseMaxUsage(%q) = %q, %d", line, id, v)
		}
		if cid, ok := containerOfCgroup(id); ok && (len(cid) == 0 || len(cid) > 128) {
			t.Fatalf("containerOfCgroup(%q) = %q", id, cid)
		}
	})
}
