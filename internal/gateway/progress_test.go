package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestWatchSandboxProgress (issue 24 §6): over the gateway's Connect handler, with a real
// runner whose backend reports an image pull and then blocks: the caller's stream shows
// the pull (phase, what it waits for, the layer's bytes), then, once the backend goes
// on, the phases in order up to RUNNING, where it ends. Another organization's key and
// an unknown ID are NOT_FOUND, no key is UNAUTHENTICATED.
func TestWatchSandboxProgress(t *testing.T) {
	release := make(chan struct{})
	be := runtimetest.NewFake()
	be.OnCreate = func(ctx context.Context, _ *runtimetest.FakeSandbox) error {
		tr := progress.From(ctx)
		tr.SetPhase(progress.PhasePullingImage)
		p := progress.NewPull("busybox")
		p.SetLayers([]string{"sha256:0123456789abcdef0123", "sha256:fedcba9876543210fedc"}, []int64{100, 400})
		p.Add(0, 100)
		p.Complete(0)
		p.Add(1, 50)
		tr.AddPull(p)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		p.Add(1, 350)
		p.Complete(1)
		tr.SetPhase(progress.PhaseStartingContainer)
		return nil
	}
	t.Cleanup(be.Close)
	rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rr.Close)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	acme, _, err := keys.Create("acme", auth.RoleUser, "acme")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := keys.Create("other", auth.RoleUser, "other")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("r1", rr)}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// One open watch per organization (MaxProgressWatchesPerOrg, made small): a second
	// watch of acme's gets the state alone and ends, holding nothing.
	s.progressWatch = newOrgSlots(8, 1)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL)
	pc := statev1connect.NewSandboxStateServiceClient(http.DefaultClient, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	req := connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		MaxLifetimeSeconds: 600, Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}}})
	req.Header().Set("Authorization", "Bearer "+acme)
	res, err := sc.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()

	watch := func(key, id string) *connect.ServerStreamForClient[statev1.WatchSandboxProgressResponse] {
		t.Helper()
		r := connect.NewRequest(&statev1.WatchSandboxProgressRequest{SandboxId: id})
		if key != "" {
			r.Header().Set("Authorization", "Bearer "+key)
		}
		st, err := pc.WatchSandboxProgress(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, c := range []struct {
		name, key, id string
		code          connect.Code
	}{
		{"another organization's key", other, id, connect.CodeNotFound},
		{"an unknown sandbox", acme, "sb-nonexistent", connect.CodeNotFound},
		{"no key", "", id, connect.CodeUnauthenticated},
	} {
		st := watch(c.key, c.id)
		if st.Receive() {
			t.Errorf("%s: got %v, want an error", c.name, st.Msg())
		}
		if connect.CodeOf(st.Err()) != c.code {
			t.Errorf("%s: %v, want %v", c.name, st.Err(), c.code)
		}
		if c.code == connect.CodeNotFound && apierr.Reason(st.Err()) != apierr.SandboxNotFound {
			t.Errorf("%s: reason %q, want %s", c.name, apierr.Reason(st.Err()), apierr.SandboxNotFound)
		}
		_ = st.Close()
	}

	st := watch(acme, id)
	defer func() { _ = st.Close() }()
	var msgs []*statev1.WatchSandboxProgressResponse
	released := false
	for st.Receive() {
		m := st.Msg()
		msgs = append(msgs, m)
		if m.GetSandboxId() != id {
			t.Fatalf("update for %q", m.GetSandboxId())
		}
		if !released && m.GetPhase() == statev1.StartPhase_START_PHASE_PULLING_IMAGE && len(m.GetPulls()) == 1 {
			p := m.GetPulls()[0]
			if m.GetState() != "STATE_CREATING" || m.GetWaitingFor() != "pulling image" || m.GetPhaseSince() == nil {
				t.Errorf("pulling: %v", m)
			}
			if p.GetImage() != "busybox" || p.GetLayersDone() != 1 || p.GetLayersTotal() != 2 || p.GetBytesDone() != 150 || p.GetBytesTotal() != 500 || len(p.GetLayers()) != 2 {
				t.Errorf("pull %v, want busybox 1/2 layers, 150/500 bytes", p)
			}
			if l := p.GetLayers()[1]; l.GetDigest() != "fedcba987654" || l.GetBytesDone() != 50 || l.GetBytesTotal() != 400 || l.GetComplete() {
				t.Errorf("layer %v", l)
			}
			// The first watch holds acme's one place: a second one beyond the cap gets
			// one message from the state, without the runner's progress, and ends.
			st2 := watch(acme, id)
			var got []*statev1.WatchSandboxProgressResponse
			for st2.Receive() {
				got = append(got, st2.Msg())
			}
			if st2.Err() != nil || len(got) != 1 || got[0].GetState() != "STATE_CREATING" || len(got[0].GetPulls()) != 0 {
				t.Errorf("a watch beyond the organization's cap: %v, %v; want one CREATING message without pulls", got, st2.Err())
			}
			_ = st2.Close()
			released = true
			close(release)
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if !released {
		close(release)
		t.Fatalf("no pull seen in %v", msgs)
	}
	if n := s.progressWatch.held(); n != 0 {
		t.Errorf("%d watches still counted after they ended", n)
	}
	last := msgs[len(msgs)-1]
	if last.GetState() != "STATE_RUNNING" || last.GetPhase() != statev1.StartPhase_START_PHASE_RUNNING || last.GetWaitingFor() != "" {
		t.Errorf("last update %v, want RUNNING", last)
	}
	// Phases only move forward: pulling image → starting container/command → running.
	for i := 1; i < len(msgs); i++ {
		if msgs[i].GetPhase() < msgs[i-1].GetPhase() {
			t.Errorf("phase went back: %v after %v", msgs[i].GetPhase(), msgs[i-1].GetPhase())
		}
	}
}
