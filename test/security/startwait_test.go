package security

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/gateway/gatewaytest"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// TestGetSandboxWaitersBounded: a GetSandbox of a starting sandbox waits for it to start
// (docs/api.md); an organization that fires many such calls at once must not pin
// unbounded goroutines on the gateway or the runner. Against a runner whose sandboxes
// never start, 300 concurrent polls of one organization: at most the per-organization
// cap of them wait, every other one is answered CREATING while those still wait, and
// another organization still gets its own place.
func TestGetSandboxWaitersBounded(t *testing.T) {
	const perOrgCap = gateway.DefaultStartWaitersPerOrg // spelled out by the gateway's default
	const calls = 300
	r := gatewaytest.NewStartingRunner("r1", runner.Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30})
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	keyA, _, err := keys.Create("org-a", auth.RoleUser, "attacker")
	if err != nil {
		t.Fatal(err)
	}
	keyB, _, err := keys.Create("org-b", auth.RoleUser, "other")
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{r}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	client := func(key string) sandboxv1connect.SandboxServiceClient {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		return sandboxv1connect.NewSandboxServiceClient(&http.Client{Transport: tr}, srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
	}
	a, b := client(keyA), client(keyB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	create := func(c sandboxv1connect.SandboxServiceClient) string {
		res, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}}}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetSandboxId()
	}
	idA, idB := create(a), create(b)

	var wg sync.WaitGroup
	answered := make(chan sandboxv1.State, calls)
	for range calls {
		wg.Go(func() {
			res, err := a.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: idA}))
			if err != nil {
				answered <- sandboxv1.State_STATE_UNSPECIFIED
				return
			}
			answered <- res.Msg.GetStatus().GetState()
		})
	}
	// Every call beyond the cap is answered while the others still wait (the runner
	// releases none until the end).
	for i := range calls - perOrgCap {
		if st := <-answered; st != sandboxv1.State_STATE_CREATING {
			t.Fatalf("answer %d: %v, want CREATING", i, st)
		}
	}
	if now, most := r.Held(); now != perOrgCap || most != perOrgCap {
		t.Errorf("the runner holds %d waits (at most %d), want the per-organization cap %d", now, most, perOrgCap)
	}
	// Another organization is not starved by the first one's waits.
	otherDone := make(chan struct{})
	go func() {
		defer close(otherDone)
		if _, err := b.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: idB})); err != nil {
			t.Error(err)
		}
	}()
	for {
		if now, _ := r.Held(); now == perOrgCap+1 {
			break
		}
		select {
		case <-otherDone:
			t.Fatal("organization b was answered without a wait while a held only its own cap")
		case <-time.After(5 * time.Millisecond):
		}
	}
	r.Release()
	wg.Wait()
	<-otherDone
}
