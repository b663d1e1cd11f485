package e2e

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/minio/minio-go/v7"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
)

// Pause, resume and fork across runners end to end: two real local stacks in this
// process (r1, r2; each its own bridge, subnet and edge) behind one gateway with a SQLite
// index, both with ONE SeaweedFS bucket as their blob store, through which a gVisor
// sandbox's checkpoint moves (resume elsewhere) or is copied (fork elsewhere). Driven
// through the public API: SandboxStateService and coreweave SandboxService.

// crossEnv is the two runners, their edges and the gateway.
type crossEnv struct {
	e      *fssS3 // the bucket, the store and the keys of org-a and org-b
	s1, s2 *stack.Stack
	l1, l2 *runner.Local
	edges  map[string]*stack.Edge // by runner ID
	ca     *pki.CA
	g      *gw
	state  statev1connect.SandboxStateServiceClient
}

// r1 offers 4 CPUs, r2 8 (requests counted without overcommit), so that a test fills
// one with a sleeper's request.
const (
	crossR1MilliCPU = 4000
	crossR2MilliCPU = 8000
)

func startCross(t *testing.T) *crossEnv {
	t.Helper()
	return startCrossWith(t, nil, nil)
}

// startCrossWith is startCross with each stack's config changed by stackMod and the
// gateway's by gwMod (given the bucket and store; either nil: none).
func startCrossWith(t *testing.T, stackMod func(*stack.Config), gwMod func(*fssS3, *gateway.Config)) *crossEnv {
	t.Helper()
	needRunsc(t)
	e := newFSSS3(t) // skips without SeaweedFS (unless SANDBOXD_REQUIRE_S3=1)
	c := &crossEnv{e: e, edges: map[string]*stack.Edge{}}
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir, "cross test CA")
	if err != nil {
		t.Fatal(err)
	}
	c.ca = ca
	c.s1, c.s2 = crossStack(t, e, 0, stackMod), crossStack(t, e, 1, stackMod)
	c.l1, c.l2 = runner.NewLocal("r1", c.s1.Runner), runner.NewLocal("r2", c.s2.Runner)
	c.l1.MilliCPU, c.l1.CPUOvercommit = crossR1MilliCPU, 1
	c.l2.MilliCPU, c.l2.CPUOvercommit = crossR2MilliCPU, 1
	for _, x := range []struct {
		l *runner.Local
		s *stack.Stack
	}{{c.l1, c.s1}, {c.l2, c.s2}} {
		ed, err := stack.StartEdge(x.l.R, stack.EdgeConfig{Listen: "127.0.0.1:0", RunnerID: x.l.ID(),
			BaseDomain: endpointDomain, CA: ca, Authorize: stack.KeyAuthorizer(e.keys), DialMark: x.s.EdgeDialMark()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ed.Close)
		c.edges[x.l.ID()] = ed
		x.l.EdgeDomain, x.l.EdgePort = endpointDomain, ed.Port()
	}
	pol := `{` + gvisorPolicy + `}`
	gcfg := gateway.Config{
		Auth: e.keys, Runners: []runner.Handle{c.l1, c.l2},
		Policies: perRunner{"r1": pol, "r2": pol},
		Index:    e.st.Sandboxes(), Orgs: e.st.Orgs(), Snapshots: e.st.Snapshots(),
		Blobs: e.blobs, SnapshotBucket: e.bucket, BlobConfig: blobconfig.Config{S3: &e.cfg},
	}
	if gwMod != nil {
		gwMod(e, &gcfg)
	}
	g, err := gateway.New(gcfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.EnableHTTP2 = true
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	c.g = gwClients(srv.URL, e.keyA, e.keyB)
	c.state = statev1connect.NewSandboxStateServiceClient(h2cClient(), srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(e.keyA)))
	return c
}

// crossStack starts this process's n-th stack with the bucket as its blob store. When the
// test ends its sandboxes are deleted, it closes, and nothing of it may be left (mounts,
// sandbox dirs, the volume pool), nor its network setup and cgroup parent.
func crossStack(t *testing.T, e *fssS3, n int, mod func(*stack.Config)) *stack.Stack {
	t.Helper()
	dir := t.TempDir()
	cfg := env.StackConfigN(dir, n)
	cfg.Blobs, cfg.BlobConfig = e.blobs, blobconfig.Config{S3: &e.cfg}
	if mod != nil {
		mod(&cfg)
	}
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start stack %d: %v", n, err)
	}
	t.Cleanup(func() {
		var ids []string
		for _, sb := range s.Runner.List() {
			ids = append(ids, sb.ID)
		}
		deleteAll(t, s)
		s.Close()
		assertNoLeaks(t, dir, ids)
		if left := stacktest.Leftovers(dir); len(left) > 0 {
			t.Errorf("stack %d left behind: %q", n, left)
			stacktest.ForceClean(dir)
		}
		if err := s.Network.Cleanup(); err != nil {
			t.Errorf("network cleanup: %v", err)
		}
		if n > 0 {
			parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cfg.CgroupParent)
			for _, p := range parents {
				_ = os.Remove(p)
			}
		}
	})
	return s
}

// stackOf is runner id's stack.
func (c *crossEnv) stackOf(id string) *stack.Stack {
	if id == "r1" {
		return c.s1
	}
	return c.s2
}

// url is the HTTPS endpoint of port 8080 of sandbox id on runner r's edge.
func (c *crossEnv) url(id, r string) string {
	return "https://" + edge.Host(8080, id, r, endpointDomain) + ":" + itoa(c.edges[r].Port()) + "/"
}

// get requests sandbox id's endpoint through runner r's edge once: status and body.
func (c *crossEnv) get(id, r string) (int, string, error) {
	addr := c.edges[r].Addr.String()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: c.ca.Pool()},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	defer hc.CloseIdleConnections()
	res, err := hc.Get(c.url(id, r))
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), nil
}

// counter reads the counter server of sandbox id through runner r's edge, waiting for it
// to listen.
func (c *crossEnv) counter(t *testing.T, id, r string) counterState {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body, err := c.get(id, r)
		if err == nil && code == 200 {
			return parseCounter(t, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint of %s on %s: %d %q %v", id, r, code, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// counterOn creates a counter sandbox (1 CPU) pinned to runner r and waits for its
// server; it is deleted when the (sub)test ends.
func (c *crossEnv) counterOn(t *testing.T, r string) (string, counterState) {
	t.Helper()
	sp := counterSpec()
	sp.Containers[0].Resources = &sandboxv1.Resources{Cpu: "1", Memory: "256Mi"}
	sp.RunnerIds = []string{r}
	sb := c.g.create(t, sp, "")
	t.Cleanup(func() { c.del(t, sb.SandboxId) })
	if got := sb.GetStatus().GetRunnerId(); got != r {
		t.Fatalf("counter sandbox pinned to %s placed on %q", r, got)
	}
	c.g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING)
	return sb.SandboxId, c.counter(t, sb.SandboxId, r)
}

// sleeperOn creates a sleeper requesting cpu, pinned to runner r, and waits until it
// runs; it is deleted when the (sub)test ends.
func (c *crossEnv) sleeperOn(t *testing.T, r, cpu string) string {
	t.Helper()
	sp := sleeperSpec()
	sp.Containers[0].Resources = &sandboxv1.Resources{Cpu: cpu, Memory: "64Mi"}
	sp.RunnerIds = []string{r}
	// Retried as clients do (RESOURCE_EXHAUSTED with RetryInfo): the gateway's view of
	// the runner is at most a probe interval old, and may not know yet that a pause
	// released a sandbox's CPU.
	deadline := time.Now().Add(10 * time.Second)
	var id string
	for {
		res, err := c.g.sandboxes.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err == nil {
			id = res.Msg.SandboxId
			break
		}
		if connect.CodeOf(err) != connect.CodeResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("create a sleeper of %s CPU on %s: %v", cpu, r, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Cleanup(func() { c.del(t, id) })
	c.g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	return id
}

// pause checkpoints sandbox id (release_resources true).
func (c *crossEnv) pause(t *testing.T, id string) *statev1.PauseStatus {
	t.Helper()
	release := true
	res, err := c.state.PauseSandbox(context.Background(), connect.NewRequest(&statev1.PauseSandboxRequest{SandboxId: id, ReleaseResources: &release}))
	if err != nil {
		t.Fatalf("pause %s: %v", id, err)
	}
	if ps := res.Msg.GetStatus(); !ps.GetResourcesReleased() || ps.GetCheckpointBytes() <= 0 {
		t.Fatalf("pause status %v: want a checkpoint", ps)
	}
	return res.Msg.GetStatus()
}

func (c *crossEnv) resume(id string, runners ...string) (*statev1.ResumeSandboxResponse, error) {
	res, err := c.state.ResumeSandbox(context.Background(), connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id, RunnerIds: runners}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// status is the gateway's GetSandbox status of id.
func (c *crossEnv) status(t *testing.T, id string) *sandboxv1.SandboxStatus {
	t.Helper()
	res, err := c.g.sandboxes.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return res.Msg.GetStatus()
}

// wantOn checks that sandbox id is RUNNING on runner r as the gateway and both runners
// see it, its endpoint URL r's.
func (c *crossEnv) wantOn(t *testing.T, id, r string) {
	t.Helper()
	st := c.status(t, id)
	if st.GetState() != sandboxv1.State_STATE_RUNNING || st.GetRunnerId() != r {
		t.Errorf("GetSandbox %s: %s on %q, want RUNNING on %s", id, st.GetState(), st.GetRunnerId(), r)
	}
	if u := st.GetServices(); len(u) != 1 || u[0].GetEndpoint().GetUrl() != strings.TrimSuffix(c.url(id, r), "/") {
		t.Errorf("%s services %v, want its endpoint on %s: %s", id, u, r, c.url(id, r))
	}
	if sb, err := c.stackOf(r).Runner.Get(id); err != nil || sb.State != runner.StateRunning {
		t.Errorf("runner %s: %s is %v (%v), want running", r, id, sb.State, err)
	}
	other := "r1"
	if r == "r1" {
		other = "r2"
	}
	for _, sb := range c.stackOf(other).Runner.List() {
		if sb.ID == id {
			t.Errorf("runner %s still lists %s (%s %s: %s)", other, id, sb.State, sb.Reason, sb.Message)
		}
	}
}

// checkpointObjects lists the objects under checkpoints/ in the bucket.
func (c *crossEnv) checkpointObjects(t *testing.T) []string {
	t.Helper()
	var out []string
	for oi := range c.e.srv.Client.ListObjects(context.Background(), c.e.bucket, minio.ListObjectsOptions{Prefix: "checkpoints/", Recursive: true}) {
		if oi.Err != nil {
			t.Fatalf("list objects: %v", oi.Err)
		}
		out = append(out, oi.Key)
	}
	return out
}

// noCheckpointObjects waits (30 s at most) until no checkpoint is left in the bucket.
func (c *crossEnv) noCheckpointObjects(t *testing.T, after string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := c.checkpointObjects(t)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: checkpoint objects left in the bucket: %q", after, left)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// del deletes sandboxes ids (those not ended yet) and waits until they ended.
func (c *crossEnv) del(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if st := c.status(t, id).GetState(); st == sandboxv1.State_STATE_TERMINATED || st == sandboxv1.State_STATE_COMPLETED || st == sandboxv1.State_STATE_FAILED {
			continue
		}
		if _, err := c.g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
			t.Errorf("delete %s: %v", id, err)
			continue
		}
	}
	for _, id := range ids {
		c.g.waitState(t, id, sandboxv1.State_STATE_TERMINATED)
	}
}

// TestPauseCross: fork onto another runner, resume on another runner (asked for, or
// because the own runner is full), and what cannot move.
func TestPauseCross(t *testing.T) {
	c := startCross(t)
	ctx := context.Background()

	t.Run("fork onto another runner", func(t *testing.T) {
		src, _ := c.counterOn(t, "r1")
		var ids []string // the forks
		t.Cleanup(func() { c.del(t, ids...) })
		c.g.sh(t, src, "echo source > /tmp/v && echo written-before > /tmp/note")
		before := c.counter(t, src, "r1")

		t0 := time.Now()
		res, err := c.state.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: src, Count: 3, RunnerIds: []string{"r2"}}))
		if err != nil {
			t.Fatalf("fork x3 onto r2: %v", err)
		}
		t.Logf("fork x3 onto r2: %v", time.Since(t0))
		forks := res.Msg.GetForks()
		if len(forks) != 3 {
			t.Fatalf("%d forks, want 3", len(forks))
		}
		for i, f := range forks {
			if f.GetError() != nil {
				t.Errorf("fork %d: %v", i, f.GetError())
			} else {
				ids = append(ids, f.GetSandboxId())
			}
		}
		if len(ids) != len(forks) {
			t.FailNow()
		}
		ips := map[string]string{}
		if sb, err := c.s1.Runner.Get(src); err == nil {
			ips[sb.IP] = src
		}
		for _, f := range forks {
			id := f.GetSandboxId()
			if f.GetRunnerId() != "r2" {
				t.Errorf("fork %s: runner_id %q, want r2", id, f.GetRunnerId())
			}
			c.g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
			c.wantOn(t, id, "r2")
			sb, err := c.s2.Runner.Get(id)
			if err != nil {
				t.Fatalf("r2 get %s: %v", id, err)
			}
			if other, dup := ips[sb.IP]; dup || sb.IP == "" {
				t.Errorf("fork %s has IP %q, as %s", id, sb.IP, other)
			}
			ips[sb.IP] = id
		}
		// Each continues the source's server and files, then on its own.
		for i, id := range ids {
			if got := c.g.sh(t, id, "cat /tmp/note"); got != "written-before\n" {
				t.Errorf("fork %d (%s): /tmp/note %q, want the source's", i, id, got)
			}
			c.g.sh(t, id, "echo fork"+itoa(i)+" > /tmp/v")
		}
		for i, id := range ids {
			got := c.counter(t, id, "r2")
			if got.boot != before.boot || got.count != before.count+1 || got.value != "fork"+itoa(i) {
				t.Errorf("fork %d (%s) through r2's edge: %+v, want boot %s count %d value fork%d", i, id, got, before.boot, before.count+1, i)
			}
			if code, _, err := c.get(id, "r1"); err == nil && code == 200 {
				t.Errorf("fork %s answers through r1's edge", id)
			}
		}
		// The source runs on r1 as it did.
		if st := c.status(t, src); st.GetState() != sandboxv1.State_STATE_RUNNING || st.GetRunnerId() != "r1" {
			t.Errorf("source after the fork: %s on %s, want RUNNING on r1", st.GetState(), st.GetRunnerId())
		}
		if got := c.counter(t, src, "r1"); got.boot != before.boot || got.count != before.count+1 || got.value != "source" {
			t.Errorf("source after the forks: %+v, want boot %s count %d value source", got, before.boot, before.count+1)
		}
		c.noCheckpointObjects(t, "after the fork")
	})

	t.Run("resume on another runner", func(t *testing.T) {
		id, first := c.counterOn(t, "r1")
		c.g.sh(t, id, "echo kept > /tmp/v && echo before-move > /tmp/note")
		c.pause(t, id)
		if st := c.status(t, id); st.GetState() != sandboxv1.State_STATE_PAUSED || st.GetRunnerId() != "r1" {
			t.Fatalf("after pause: %s on %s", st.GetState(), st.GetRunnerId())
		}

		t0 := time.Now()
		res, err := c.resume(id, "r2")
		if err != nil {
			t.Fatalf("resume on r2: %v", err)
		}
		t.Logf("resume on another runner: %v", time.Since(t0))
		if res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" || res.GetSandboxId() != id {
			t.Errorf("resume on r2 answered %v, want runner_id r2, moved_from r1", res)
		}
		c.wantOn(t, id, "r2")
		if got := c.counter(t, id, "r2"); got.boot != first.boot || got.count != first.count+1 || got.value != "kept" {
			t.Errorf("after the move: %+v, want boot %s count %d value kept", got, first.boot, first.count+1)
		}
		if code, body, err := c.get(id, "r1"); err == nil && code == 200 {
			t.Errorf("the moved sandbox still answers through r1's edge: %q", body)
		}
		if got := c.g.sh(t, id, "cat /tmp/note"); got != "before-move\n" {
			t.Errorf("exec after the move: /tmp/note %q", got)
		}
		c.noCheckpointObjects(t, "after the move")

		// A second cycle, on r2: in place now; files written between the cycles survive.
		c.g.sh(t, id, "echo between > /tmp/between")
		c.pause(t, id)
		res, err = c.resume(id)
		if err != nil {
			t.Fatalf("second resume: %v", err)
		}
		if res.GetRunnerId() != "r2" || res.GetMovedFrom() != "" {
			t.Errorf("second resume answered %v, want runner_id r2 and no move", res)
		}
		c.wantOn(t, id, "r2")
		if got := c.g.sh(t, id, "cat /tmp/between /tmp/note"); got != "between\nbefore-move\n" {
			t.Errorf("files after the second cycle: %q", got)
		}
		if got := c.counter(t, id, "r2"); got.boot != first.boot || got.count != first.count+2 {
			t.Errorf("after the second cycle: %+v, want boot %s count %d", got, first.boot, first.count+2)
		}
	})

	t.Run("resume elsewhere when the own runner is full", func(t *testing.T) {
		id, first := c.counterOn(t, "r1")
		c.pause(t, id)
		// r1 fills while it is paused: 3.5 of its 4 CPUs; the sandbox needs 1.
		c.sleeperOn(t, "r1", "3500m")
		res, err := c.resume(id)
		if err != nil {
			t.Fatalf("resume with r1 full: %v", err)
		}
		if res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" {
			t.Errorf("resume with r1 full answered %v, want runner_id r2, moved_from r1", res)
		}
		c.wantOn(t, id, "r2")
		if got := c.counter(t, id, "r2"); got.boot != first.boot || got.count != first.count+1 {
			t.Errorf("after the move: %+v, want boot %s count %d", got, first.boot, first.count+1)
		}
		c.noCheckpointObjects(t, "after the move")
	})

	t.Run("refusals", func(t *testing.T) {
		// runc: frozen, its memory on r1's host; it cannot move.
		frozen := c.sleeperOn(t, "r1", "100m")
		if _, err := c.state.PauseSandbox(ctx, connect.NewRequest(&statev1.PauseSandboxRequest{SandboxId: frozen})); err != nil {
			t.Fatalf("freeze: %v", err)
		}
		_, err := c.resume(frozen, "r2")
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) == "" || !strings.Contains(strings.ToLower(err.Error()), "frozen") {
			t.Errorf("resume of a frozen sandbox on r2: %v, want FAILED_PRECONDITION with a reason, saying it is frozen", err)
		}
		if st := c.status(t, frozen); st.GetState() != sandboxv1.State_STATE_PAUSED || st.GetRunnerId() != "r1" {
			t.Errorf("frozen sandbox after the refusal: %s on %s, want PAUSED on r1", st.GetState(), st.GetRunnerId())
		}
		if res, err := c.resume(frozen); err != nil || res.GetRunnerId() != "r1" || res.GetMovedFrom() != "" {
			t.Errorf("resume of the frozen sandbox in place: %v %v", res, err)
		}

		// No runner has room: the error names each runner's reason.
		id, _ := c.counterOn(t, "r1")
		c.pause(t, id)
		c.sleeperOn(t, "r1", "3500m")
		full2 := c.sleeperOn(t, "r2", "7500m")
		_, err = c.resume(id)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if err == nil || !strings.Contains(msg, "r1") || !strings.Contains(msg, "r2") || apierr.Reason(err) == "" {
			t.Errorf("resume with no runner able to take it: %v, want an error with a reason naming r1's and r2's", err)
		}
		t.Logf("no runner able: %v", err)
		if st := c.status(t, id); st.GetState() != sandboxv1.State_STATE_PAUSED || st.GetRunnerId() != "r1" {
			t.Errorf("after the refused resume: %s on %s, want PAUSED on r1", st.GetState(), st.GetRunnerId())
		}
		c.noCheckpointObjects(t, "after the refused resume")
		// Room again on r2: it moves there (retried as clients do while the gateway's
		// view of r2, at most a probe interval old, still has the deleted sleeper).
		c.del(t, full2)
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := c.resume(id)
			if connect.CodeOf(err) == connect.CodeResourceExhausted && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			if err != nil || res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" {
				t.Errorf("resume once r2 has room: %v %v", res, err)
			}
			break
		}
	})

	// Nothing moved or forked is left behind in the bucket; the index lists each sandbox
	// once.
	c.noCheckpointObjects(t, "at the end")
	list, err := c.g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, sb := range list.Msg.GetSandboxes() {
		if slices.Contains(seen, sb.GetSandboxId()) {
			t.Errorf("ListSandboxes lists %s twice", sb.GetSandboxId())
		}
		seen = append(seen, sb.GetSandboxId())
	}
}
