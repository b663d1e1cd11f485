package runnerapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

func (f *fakeRunner) Pause(_ context.Context, _ string, opts runner.PauseOptions) (runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pauseOpts = opts
	sb := f.sb
	sb.State = runner.StatePaused
	sb.Pause = &runner.PauseStatus{Released: opts.Release == nil || *opts.Release, AutoResume: opts.AutoResume, LifetimeHeld: true,
		PausedAt: time.Unix(1000, 5).UTC(), CheckpointBytes: 1 << 20}
	return sb, f.err
}

func (f *fakeRunner) Resume(context.Context, string) (runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sb
	sb.State = runner.StateRunning
	return sb, f.err
}

func (f *fakeRunner) Fork(_ context.Context, _ string, ts []runner.ForkTarget) ([]runner.ForkResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forkTargets = ts
	return f.forkResults, f.err
}

// TestRunnerapiPauseResumeFork: the new RPCs carry their options, the pause status, a
// PAUSED state and each fork's sandbox or error both ways.
func TestRunnerapiPauseResumeFork(t *testing.T) {
	fake := &fakeRunner{sb: runner.Sandbox{ID: "abc", State: runner.StateRunning, CreatedAt: time.Unix(10, 0)}}
	r := startRunner(t, fake)
	c := r.client(t)
	ctx := context.Background()

	for _, release := range []*bool{nil, new(bool), ptrTo(true)} {
		sb, err := c.Pause(ctx, "abc", runner.PauseOptions{Release: release, AutoResume: true})
		if err != nil {
			t.Fatal(err)
		}
		got := fake.pauseOpts
		if (got.Release == nil) != (release == nil) || release != nil && *got.Release != *release || !got.AutoResume {
			t.Errorf("pause options on the runner: %+v, sent release %v", got, release)
		}
		want := runner.PauseStatus{Released: release == nil || *release, AutoResume: true, LifetimeHeld: true, PausedAt: time.Unix(1000, 5).UTC(), CheckpointBytes: 1 << 20}
		if sb.State != runner.StatePaused || sb.Pause == nil || *sb.Pause != want {
			t.Errorf("paused sandbox: %s %+v, want %+v", sb.State, sb.Pause, want)
		}
	}
	sb, err := c.Resume(ctx, "abc")
	if err != nil || sb.State != runner.StateRunning || sb.Pause != nil {
		t.Errorf("resume: %s %+v %v", sb.State, sb.Pause, err)
	}

	fake.forkResults = []runner.ForkResult{
		{Sandbox: runner.Sandbox{ID: "f1", State: runner.StateRunning, Spec: runtime.Spec{ID: "f1", Meta: map[string]string{runtime.MetaForkedFrom: "abc"}}}},
		{Sandbox: runner.Sandbox{ID: "f2", State: runner.StateFailed, Reason: runner.ReasonForkFailed}, Err: errors.New("restore failed")},
		{Sandbox: runner.Sandbox{ID: "f3", State: runner.StateFailed}, Err: fmt.Errorf("%w: f3 is gone", runner.ErrNotRunning)},
	}
	targets := []runner.ForkTarget{{ID: "f1", Meta: map[string]string{"k": "v"}, ShareTokenHash: "h", Lifetime: time.Minute,
		EgressSecretValues: map[string]string{"prod/api#token": "v1"}}, {ID: "f2"}, {ID: "f3"}}
	res, err := c.Fork(ctx, "abc", targets)
	if err != nil {
		t.Fatal(err)
	}
	if got := fake.forkTargets; len(got) != 3 || got[0].ID != "f1" || got[0].Meta["k"] != "v" || got[0].ShareTokenHash != "h" || got[0].Lifetime != time.Minute || got[1].Lifetime != 0 ||
		got[0].EgressSecretValues["prod/api#token"] != "v1" || got[1].EgressSecretValues != nil {
		t.Errorf("fork targets on the runner: %+v", got)
	}
	if len(res) != 3 || res[0].Err != nil || res[0].Sandbox.State != runner.StateRunning || res[0].Sandbox.Spec.Meta[runtime.MetaForkedFrom] != "abc" {
		t.Fatalf("fork results: %+v", res)
	}
	if e := res[1].Err; e == nil || connect.CodeOf(e) != connect.CodeInternal || res[1].Sandbox.Reason != runner.ReasonForkFailed {
		t.Errorf("failed fork: %v (%s)", e, connect.CodeOf(e))
	}
	if e := res[2].Err; !errors.Is(e, runner.ErrNotRunning) || apierr.Reason(e) != apierr.SandboxNotRunning {
		t.Errorf("fork not running: %v", e)
	}
}

// TestRunnerapiPauseErrors: the pause errors map to their API reasons on the wire and
// back to the runner's sentinels at the client.
func TestRunnerapiPauseErrors(t *testing.T) {
	fake := &fakeRunner{sb: runner.Sandbox{ID: "abc", State: runner.StateRunning}}
	r := startRunner(t, fake)
	c := r.client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		err    error
		reason string
		is     error
	}{
		{"paused", fmt.Errorf("%w: abc", runner.ErrPaused), apierr.SandboxNotRunning, runner.ErrPaused},
		{"already paused", fmt.Errorf("%w: abc", runner.ErrAlreadyPaused), apierr.SandboxNotRunning, runner.ErrAlreadyPaused},
		{"cannot checkpoint", fmt.Errorf("%w sandboxes of runtime class \"runc\": use gvisor", runner.ErrCannotCheckpoint), apierr.CheckpointNotSupported, runner.ErrCannotCheckpoint},
		{"not found", fmt.Errorf("%w: abc", runtime.ErrNotFound), apierr.SandboxNotFound, runtime.ErrNotFound},
		{"node agent unavailable", fmt.Errorf("pause sandbox abc: %w", runtime.ErrNodeAgentUnavailable), apierr.NodeAgentUnavailable, runtime.ErrNodeAgentUnavailable},
		{"node agent refused", fmt.Errorf("pause sandbox abc: %w", runtime.ErrNodeAgentRefused), apierr.NodeAgentRefused, runtime.ErrNodeAgentRefused},
		// A node agent's refusal for its quota is both; the space's reason wins.
		{"checkpoint space exhausted", fmt.Errorf("pause sandbox abc: %w: %w", runtime.ErrNodeAgentRefused, runtime.ErrCheckpointSpaceExhausted), apierr.CheckpointSpaceExhausted, runtime.ErrCheckpointSpaceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wire := toStatus("abc", tc.err)
			if apierr.Reason(wire) != tc.reason || connect.CodeOf(wire) != apierr.Code(tc.reason) {
				t.Errorf("wire: %v %s", wire, apierr.Reason(wire))
			}
			fake.mu.Lock()
			fake.err = tc.err
			fake.mu.Unlock()
			want := tc.is
			if errors.Is(want, runner.ErrPaused) {
				want = runner.ErrAlreadyPaused // a Pause of a paused sandbox
			}
			_, err := c.Pause(ctx, "abc", runner.PauseOptions{})
			if !errors.Is(err, want) || apierr.Reason(err) != tc.reason {
				t.Errorf("pause: %v, want errors.Is %v", err, want)
			}
			// The gateway relays it as it came: reason, code and RetryInfo (only for
			// what a retry can fix).
			relayed := runner.APIError("abc", err, runner.SpecField)
			wantRetry := tc.reason == apierr.NodeAgentUnavailable
			if apierr.Reason(relayed) != tc.reason || connect.CodeOf(relayed) != apierr.Code(tc.reason) ||
				(apierr.RetryInfo(relayed) != nil) != wantRetry || (apierr.RetryInfo(wire) != nil) != wantRetry {
				t.Errorf("relayed by the gateway: %v %s (RetryInfo %v, on the wire %v)", relayed, apierr.Reason(relayed), apierr.RetryInfo(relayed), apierr.RetryInfo(wire))
			}
			if wantRetry && apierr.RetryInfo(relayed).GetRetryDelay().AsDuration() != runner.NodeAgentRetryAfter {
				t.Errorf("relayed RetryInfo %v, want %v", apierr.RetryInfo(relayed), runner.NodeAgentRetryAfter)
			}
			if _, err := c.Fork(ctx, "abc", []runner.ForkTarget{{ID: "f"}}); !errors.Is(err, tc.is) && !(errors.Is(tc.is, runner.ErrAlreadyPaused) && errors.Is(err, runner.ErrPaused)) {
				t.Errorf("fork: %v, want errors.Is %v", err, tc.is)
			}
		})
	}
}

// TestRunnerapiPauseRefusedByBackend: a real runner whose backend cannot pause refuses
// over the wire with FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED, and reports
// no checkpoint class in its capacity.
func TestRunnerapiPauseRefusedByBackend(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	rn, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rn.Close)
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	c := serveLocal(t, ca, runner.NewLocal("r1", rn))
	ctx := context.Background()
	sb, err := c.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, _ := c.Get(ctx, sb.ID); got.State == runner.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not running")
		}
	}
	_, err = c.Pause(ctx, sb.ID, runner.PauseOptions{})
	if !errors.Is(err, runner.ErrCannotCheckpoint) || connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.CheckpointNotSupported {
		t.Errorf("pause: %v", err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Errorf("resume of a running sandbox: %v", err)
	}
	capa, err := c.Capacity(ctx)
	if err != nil || len(capa.CheckpointClasses) != 0 || capa.Paused != 0 {
		t.Errorf("capacity: checkpoint classes %v paused %d %v", capa.CheckpointClasses, capa.Paused, err)
	}
	got := capacityFromProto(capacityToProto(runner.Capacity{Paused: 3, CheckpointClasses: []string{"gvisor"}}))
	if got.Paused != 3 || !slices.Equal(got.CheckpointClasses, []string{"gvisor"}) {
		t.Errorf("capacity round trip: %d %v", got.Paused, got.CheckpointClasses)
	}
}

// serveLocal serves l as runner r1 over mTLS on loopback and returns a client of it.
func serveLocal(t *testing.T, ca *pki.CA, l *runner.Local) *Client {
	t.Helper()
	cfg, err := ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServerFor(l, nil).HTTPServer(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return (&testRunner{addr: ln.Addr().String(), ca: ca}).client(t)
}
