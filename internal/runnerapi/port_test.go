package runnerapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// What the fake runner was asked of the checkpoint RPCs.
type portCalls struct {
	importReq runner.ImportRequest
	deleted   string
	movedID   string
	movedTo   string
}

var (
	fakePortsMu sync.Mutex
	fakePorts   = map[*fakeRunner]*portCalls{}
)

func (f *fakeRunner) calls() *portCalls {
	fakePortsMu.Lock()
	defer fakePortsMu.Unlock()
	if fakePorts[f] == nil {
		fakePorts[f] = &portCalls{}
	}
	return fakePorts[f]
}

func (f *fakeRunner) ExportCheckpoint(_ context.Context, id string) (runner.CheckpointRef, runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sb
	return runner.CheckpointRef{Key: "checkpoints/" + id + "/e1/manifest.json", Platform: "gvisor runsc-1 linux/amd64", Bytes: 12345}, sb, f.err
}

func (f *fakeRunner) ImportFork(_ context.Context, req runner.ImportRequest) ([]runner.ForkResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls().importReq = req
	return f.forkResults, f.err
}

func (f *fakeRunner) DeleteCheckpoint(_ context.Context, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls().deleted = key
	return f.err
}

func (f *fakeRunner) Moved(_ context.Context, id, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls().movedID, f.calls().movedTo = id, to
	return f.err
}

// TestRunnerapiCheckpointPorting: ExportCheckpoint, ImportFork, DeleteCheckpoint and
// Moved carry their arguments and answers both ways, and their errors map back to the
// runner's sentinels.
func TestRunnerapiCheckpointPorting(t *testing.T) {
	created := time.Unix(10, 0).UTC()
	fake := &fakeRunner{sb: runner.Sandbox{ID: "abc", State: runner.StatePaused, CreatedAt: created, Lifetime: time.Hour, Deadline: created.Add(time.Hour),
		Spec:  runtime.Spec{ID: "abc", Container: runtime.Container{Image: "busybox"}, Meta: map[string]string{"k": "v"}},
		Pause: &runner.PauseStatus{Released: true, LifetimeHeld: true, PausedAt: time.Unix(20, 0).UTC()}}}
	r := startRunner(t, fake)
	c := r.client(t)
	ctx := context.Background()

	ref, src, err := c.ExportCheckpoint(ctx, "abc")
	if err != nil {
		t.Fatal(err)
	}
	if ref != (runner.CheckpointRef{Key: "checkpoints/abc/e1/manifest.json", Platform: "gvisor runsc-1 linux/amd64", Bytes: 12345}) ||
		src.ID != "abc" || src.State != runner.StatePaused || !src.Pause.LifetimeHeld || !src.Deadline.Equal(created.Add(time.Hour)) {
		t.Fatalf("export: %+v %+v", ref, src)
	}

	fake.forkResults = []runner.ForkResult{{Sandbox: runner.Sandbox{ID: "abc", State: runner.StateRunning, CreatedAt: created}}}
	res, err := c.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: src, Move: true, Targets: []runner.ForkTarget{{ID: "abc"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := fake.calls().importReq
	if got.Ref != ref || !got.Move || len(got.Targets) != 1 || got.Targets[0].ID != "abc" || got.Source.ID != "abc" ||
		got.Source.Spec.Image != "busybox" || got.Source.Spec.Meta["k"] != "v" || got.Source.Pause == nil ||
		!got.Source.Pause.PausedAt.Equal(time.Unix(20, 0)) || got.Source.Lifetime != time.Hour {
		t.Fatalf("import request on the runner: %+v", got)
	}
	if len(res) != 1 || res[0].Err != nil || res[0].Sandbox.State != runner.StateRunning || !res[0].Sandbox.CreatedAt.Equal(created) {
		t.Fatalf("import results: %+v", res)
	}
	fake.forkResults = []runner.ForkResult{
		{Sandbox: runner.Sandbox{ID: "f1", State: runner.StateRunning}},
		{Sandbox: runner.Sandbox{ID: "f2", State: runner.StateFailed, Reason: runner.ReasonForkFailed}, Err: errors.New("part run: sha256 mismatch")},
	}
	res, err = c.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: src, Targets: []runner.ForkTarget{{ID: "f1", Meta: map[string]string{"o": "1"}, Lifetime: time.Minute}, {ID: "f2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := fake.calls().importReq; got.Move || len(got.Targets) != 2 || got.Targets[0].Meta["o"] != "1" || got.Targets[0].Lifetime != time.Minute {
		t.Fatalf("fork import request on the runner: %+v", got)
	}
	if len(res) != 2 || res[0].Err != nil || res[1].Err == nil || !strings.Contains(res[1].Err.Error(), "sha256") {
		t.Fatalf("fork import results: %+v", res)
	}

	if err := c.DeleteCheckpoint(ctx, ref.Key); err != nil || fake.calls().deleted != ref.Key {
		t.Fatalf("delete: %v, runner got %q", err, fake.calls().deleted)
	}
	if err := c.Moved(ctx, "abc", "r2"); err != nil || fake.calls().movedID != "abc" || fake.calls().movedTo != "r2" {
		t.Fatalf("moved: %v, runner got %q %q", err, fake.calls().movedID, fake.calls().movedTo)
	}

	for _, tc := range []struct {
		err    error
		reason string
		is     error
	}{
		{fmt.Errorf("%w: the checkpoint was made on platform \"a\"; this runner restores on \"b\"", runner.ErrCannotCheckpoint), apierr.CheckpointNotSupported, runner.ErrCannotCheckpoint},
		{fmt.Errorf("%w: no checkpoint x", runtime.ErrNotFound), apierr.SandboxNotFound, runtime.ErrNotFound},
		{fmt.Errorf("%w: abc is RUNNING", runner.ErrNotRunning), apierr.SandboxNotRunning, runner.ErrNotRunning},
	} {
		fake.mu.Lock()
		fake.err = tc.err
		fake.mu.Unlock()
		_, _, err1 := c.ExportCheckpoint(ctx, "abc")
		_, err2 := c.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: src, Targets: []runner.ForkTarget{{ID: "f"}}})
		err3 := c.DeleteCheckpoint(ctx, ref.Key)
		err4 := c.Moved(ctx, "abc", "r2")
		for i, err := range []error{err1, err2, err3, err4} {
			if !errors.Is(err, tc.is) || apierr.Reason(err) != tc.reason {
				t.Errorf("call %d with %v: %v (%s)", i, tc.err, err, apierr.Reason(err))
			}
		}
	}
	fake.mu.Lock()
	fake.err = &runner.ValidationError{Violations: []apierr.Violation{{Field: "targets", Description: "a move has one target"}}}
	fake.mu.Unlock()
	var verr *runner.ValidationError
	if _, err := c.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: src, Targets: []runner.ForkTarget{{ID: "f"}}}); !errors.As(err, &verr) || connect.CodeOf(runner.APIError("f", err, "")) != connect.CodeInvalidArgument {
		t.Errorf("invalid import: %v", err)
	}
}

// TestCapacityCheckpointPlatforms: the platforms travel, bounded in count and length.
func TestCapacityCheckpointPlatforms(t *testing.T) {
	got := capacityFromProto(capacityToProto(runner.Capacity{CheckpointClasses: []string{"gvisor"}, CheckpointPlatforms: map[string]string{"gvisor": "gvisor runsc-1 linux/amd64"}}))
	if len(got.CheckpointPlatforms) != 1 || got.CheckpointPlatforms["gvisor"] != "gvisor runsc-1 linux/amd64" {
		t.Fatalf("round trip: %v", got.CheckpointPlatforms)
	}
	many := map[string]string{"long": strings.Repeat("x", maxPlatformLen+1), "empty": "", strings.Repeat("c", maxClassNameLen+1): "p"}
	for i := range 100 {
		many[fmt.Sprintf("class-%03d", i)] = "p"
	}
	got = capacityFromProto(capacityToProto(runner.Capacity{CheckpointPlatforms: many}))
	if len(got.CheckpointPlatforms) != maxCheckpointClasses || got.CheckpointPlatforms["class-000"] != "p" {
		t.Fatalf("bounded: %d entries", len(got.CheckpointPlatforms))
	}
	for k, v := range got.CheckpointPlatforms {
		if v == "" || len(v) > maxPlatformLen || len(k) > maxClassNameLen {
			t.Fatalf("kept %q: %q", k, v)
		}
	}
	if got := capacityFromProto(capacityToProto(runner.Capacity{})); got.CheckpointPlatforms != nil {
		t.Fatalf("none: %v", got.CheckpointPlatforms)
	}
}

// TestImportForkAgainstTheRunnersPolicy: an import is checked against the runner's own
// policy as a create is: refused whole when the source's spec breaks it, and a fork's
// Meta takes the runner's policy revision.
func TestImportForkAgainstTheRunnersPolicy(t *testing.T) {
	fake := &fakeRunner{forkResults: []runner.ForkResult{{Sandbox: runner.Sandbox{ID: "f1", State: runner.StateRunning}}}}
	src := runner.Sandbox{ID: "abc", State: runner.StatePaused, Lifetime: time.Hour,
		Spec: runtime.Spec{ID: "abc", Container: runtime.Container{Image: "busybox", Resources: runtime.Resources{RequestMilliCPU: 2000, MilliCPU: 2000}}}}
	req := func(move bool) *connect.Request[runnerv1.ImportForkRequest] {
		return connect.NewRequest(&runnerv1.ImportForkRequest{Ref: &runnerv1.CheckpointRef{Key: "checkpoints/abc/e/manifest.json", Platform: "p"},
			Source: sandboxToProto(src), Targets: forkTargetsToProto([]runner.ForkTarget{{ID: "f1", Meta: map[string]string{"k": "v"}}}), Move: move})
	}
	strict := newServer(fake, nil, nil).WithPolicy("r1", staticPolicy(`{"constraints": {"resources": {"max_cpu": "1"}}}`))
	for _, move := range []bool{false, true} {
		_, err := strict.ImportFork(context.Background(), req(move))
		if apierr.Reason(err) == "" || connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "policy") {
			t.Fatalf("move %v: a spec the runner's policy refuses: %v", move, err)
		}
	}
	if fake.calls().importReq.Ref.Key != "" {
		t.Fatal("the runner was asked to import what its policy refuses")
	}
	lax := newServer(fake, nil, nil).WithPolicy("r1", staticPolicy(`{}`))
	if _, err := lax.ImportFork(context.Background(), req(false)); err != nil {
		t.Fatal(err)
	}
	got := fake.calls().importReq.Targets[0].Meta
	if got["k"] != "v" || got[runtime.MetaPolicyRevision] != "7" {
		t.Fatalf("fork meta after the runner's policy: %v", got)
	}
}

// portBackend is a runtimetest.Fake that "pauses" (its sandboxes go on as they were) and
// moves checkpoints through the blob store on platform: one part, "image".
type portBackend struct {
	*runtimetest.Fake
	platform string
}

func (b *portBackend) PauseSupport(string) runtime.PauseSupport {
	return runtime.PauseSupport{Freeze: true, Checkpoint: true}
}

func (b *portBackend) Pause(_ context.Context, _ string, release bool) (runtime.PauseInfo, error) {
	return runtime.PauseInfo{Released: release}, nil
}

func (b *portBackend) Resume(_ context.Context, id string) (runtime.Info, error) {
	return runtime.Info{ID: id}, nil
}

func (b *portBackend) Fork(_ context.Context, _ string, specs []*runtime.Spec) ([]runtime.Info, []error) {
	infos := make([]runtime.Info, len(specs))
	for i, s := range specs {
		infos[i] = runtime.Info{ID: s.ID, StartedAt: time.Now()}
		b.Put(runtime.Recovered{Spec: *s, Info: infos[i], Alive: true})
	}
	return infos, make([]error, len(specs))
}

func (b *portBackend) CheckpointPlatform(string) string { return b.platform }

func (b *portBackend) ExportCheckpoint(ctx context.Context, id string, put func(context.Context, string, io.Reader) error) (runtime.CheckpointExport, error) {
	if err := put(ctx, "image", strings.NewReader("memory of "+id)); err != nil {
		return runtime.CheckpointExport{}, err
	}
	return runtime.CheckpointExport{Platform: b.platform, Parts: []string{"image"}}, nil
}

func (b *portBackend) ForkFromCheckpoint(ctx context.Context, cp runtime.CheckpointExport, open func(context.Context, string) (io.ReadCloser, error), specs []*runtime.Spec) ([]runtime.Info, []error) {
	for _, p := range cp.Parts {
		rc, err := open(ctx, p)
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			_ = rc.Close()
		}
		if err != nil {
			errs := make([]error, len(specs))
			for i := range errs {
				errs[i] = err
			}
			return nil, errs
		}
	}
	return b.Fork(ctx, "", specs)
}

// TestRunnerapiMoveBetweenRunners: a paused sandbox moves from one runner to another over
// RunnerService (export, import as a move, Moved), both sharing a blob store; a runner
// of another platform refuses the checkpoint with CWSANDBOX_CHECKPOINT_NOT_SUPPORTED.
func TestRunnerapiMoveBetweenRunners(t *testing.T) {
	ctx := context.Background()
	store, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	serve := func(id, platform string) *Client {
		be := &portBackend{Fake: runtimetest.NewFake(), platform: platform}
		t.Cleanup(be.Close)
		rn, err := runner.New(ctx, runner.Config{Backend: be, DataDir: t.TempDir(), Blobs: store, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rn.Close)
		l := runner.NewLocal(id, rn)
		l.MilliCPU, l.MemoryBytes = 2000, 8<<30
		return serveLocal(t, ca, l)
	}
	a, b, other := serve("r1", "p1"), serve("r2", "p1"), serve("r3", "p2")
	running := func(c *Client, id string) runner.Sandbox {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got, _ := c.Get(ctx, id); got.State == runner.StateRunning {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not running", id)
			}
		}
	}
	// A spec with much in it: what crossed the wire twice must still be the manifest's.
	spec := runtime.Spec{
		Container: runtime.Container{Name: "main", Image: "busybox", Command: "sh", Args: []string{"-c", "sleep 1d"}, Env: map[string]string{"A": "1"},
			WorkingDir: "/w", Files: []runtime.File{{Path: "/etc/x", Content: []byte("x"), Mode: 0o600}},
			VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}}},
		Sidecars: []runtime.Container{{Name: "side", Image: "alpine", Env: map[string]string{"B": "2"}}},
		Volumes:  []runtime.Volume{{Name: "data", SizeBytes: 1 << 20}},
		Meta:     map[string]string{runtime.MetaOrg: "org1"},
	}
	sb, err := a.Create(ctx, runner.CreateRequest{Spec: spec, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	running(a, sb.ID)
	if _, err := a.Pause(ctx, sb.ID, runner.PauseOptions{Release: ptrTo(true)}); err != nil {
		t.Fatal(err)
	}
	if c, err := b.Capacity(ctx); err != nil || len(c.CheckpointPlatforms) == 0 || c.CheckpointPlatforms[c.RuntimeClasses[0]] != "p1" {
		t.Fatalf("capacity: %v %v", c.CheckpointPlatforms, err)
	}
	ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: src, Move: true, Targets: []runner.ForkTarget{{ID: sb.ID}}})
	if !errors.Is(err, runner.ErrCannotCheckpoint) || apierr.Reason(err) != apierr.CheckpointNotSupported || !strings.Contains(err.Error(), "p2") {
		t.Fatalf("import on another platform: %v", err)
	}
	res, err := b.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: src, Move: true, Targets: []runner.ForkTarget{{ID: sb.ID}}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("move: %v %+v", err, res)
	}
	moved := running(b, sb.ID)
	if !moved.CreatedAt.Equal(src.CreatedAt) || !moved.Deadline.Equal(src.Deadline) {
		t.Fatalf("moved: created %s deadline %s, source %s %s", moved.CreatedAt, moved.Deadline, src.CreatedAt, src.Deadline)
	}
	if err := a.Moved(ctx, sb.ID, "r2"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, sb.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("source runner after Moved: %v", err)
	}
	if err := a.Moved(ctx, sb.ID, "r2"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Moved again: %v", err)
	}
	if err := b.DeleteCheckpoint(ctx, ref.Key); err != nil {
		t.Fatal(err)
	}
	for _, err := range store.List(ctx, "checkpoints/") {
		t.Fatalf("left in the store: %v", err)
	}
}
