package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
)

// These tests cover what test/conformance/test_pause.py (the official Python client)
// does not: endpoint traffic and pause, forks with endpoints, idle pause, the lifetime
// while paused, and a runner killed mid-operation (pause_crash_test.go).

// counterServer is a Python HTTP server on 8080 with state in memory: a token drawn at
// start and a request counter. GET / answers "<token> <count> <content of /tmp/v>".
const counterServer = `import http.server, random
boot = "%016x" % random.getrandbits(64)
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        try:
            v = open("/tmp/v").read().strip()
        except OSError:
            v = "-"
        b = ("%s %d %s\n" % (boot, n, v)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
`

// counterSpec is a gVisor sandbox running counterServer with an OPEN HTTPS endpoint on 8080.
func counterSpec() *sandboxv1.SandboxSpec {
	sp := spec(python(), "python3", "-c", counterServer)
	sp.RuntimeClass = local.GVisorClass
	sp.Services = []*sandboxv1.Service{{Port: 8080, Name: "web", Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC,
		Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN}}}
	return sp
}

// counterState is one answer of counterServer.
type counterState struct {
	boot  string
	count int
	value string
}

func parseCounter(t *testing.T, body string) counterState {
	t.Helper()
	f := strings.Fields(body)
	if len(f) != 3 {
		t.Fatalf("counter server answered %q", body)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("counter server answered %q", body)
	}
	return counterState{boot: f[0], count: n, value: f[2]}
}

// pauseGateway is an edge gateway (startEdgeGateway) whose policy allows gVisor, with
// the SandboxStateService of org a.
type pauseGateway struct {
	*edgeGateway
	pol   *policies
	state statev1connect.SandboxStateServiceClient
}

func startPauseGateway(t *testing.T, policyDoc string) *pauseGateway {
	t.Helper()
	needRunsc(t)
	pg := &pauseGateway{edgeGateway: &edgeGateway{}, pol: &policies{}}
	pg.pol.set(policyDoc)
	eg := pg.edgeGateway
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir, "edge test CA")
	if err != nil {
		t.Fatal(err)
	}
	eg.ca, eg.caFile = ca, dir+"/ca.pem"
	eg.stack = startedStack(t)
	eg.gw = startGatewayOn(t, eg.stack, func(c *gateway.Config) {
		c.Policies = pg.pol
		eg.local = c.Runners[0].(*runner.Local)
		eg.keys = c.Auth
		eg.startEdge(t)
	})
	pg.state = statev1connect.NewSandboxStateServiceClient(h2cClient(), eg.url, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(eg.keyA)))
	return pg
}

const gvisorPolicy = `"constraints": {"security": {"allowed_runtime_classes": ["runc", "gvisor"]}}`

func h2cClient() *http.Client {
	return &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
}

// url is the HTTPS endpoint of port 8080 of sandbox id at the edge.
func (pg *pauseGateway) url(id string) string {
	return "https://" + edge.Host(8080, id, "local", endpointDomain) + ":" + itoa(pg.edge.Port()) + "/"
}

// get requests url once (no retry): status and body, or the error.
func (pg *pauseGateway) get(url string) (int, string, error) {
	res, err := pg.client(nil).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), nil
}

// counter reads the counter server behind id's endpoint, waiting for it to listen.
func (pg *pauseGateway) counter(t *testing.T, id string) counterState {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body, err := pg.get(pg.url(id))
		if err == nil && code == 200 {
			return parseCounter(t, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint of %s: %d %q %v", id, code, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (pg *pauseGateway) pause(t *testing.T, id string, autoResume *bool) *statev1.PauseStatus {
	t.Helper()
	res, err := pg.state.PauseSandbox(context.Background(), connect.NewRequest(&statev1.PauseSandboxRequest{SandboxId: id, AutoResume: autoResume}))
	if err != nil {
		t.Fatalf("pause %s: %v", id, err)
	}
	return res.Msg.GetStatus()
}

func (pg *pauseGateway) stateOf(t *testing.T, id string) *sandboxv1.SandboxStatus {
	t.Helper()
	res, err := pg.sandboxes.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return res.Msg.GetStatus()
}

// TestPauseEndpointTraffic: a request to the endpoint of a checkpointed sandbox resumes
// it and is served by the same process (its memory intact); with auto-resume off the
// edge answers 503 and the sandbox stays paused until an explicit resume.
func TestPauseEndpointTraffic(t *testing.T) {
	pg := startPauseGateway(t, `{`+gvisorPolicy+`}`)
	ctx := context.Background()
	id := pg.create(t, counterSpec(), "").SandboxId
	pg.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	first := pg.counter(t, id)
	pg.sh(t, id, "echo kept > /tmp/v")

	ps := pg.pause(t, id, nil)
	if !ps.GetResourcesReleased() || !ps.GetAutoResume() || ps.GetCheckpointBytes() <= 0 {
		t.Errorf("pause status %v: want a checkpoint, auto-resume on", ps)
	}
	if st := pg.stateOf(t, id); st.GetState() != sandboxv1.State_STATE_PAUSED {
		t.Fatalf("after pause: %s", st.GetState())
	}
	t0 := time.Now()
	code, body, err := pg.get(pg.url(id))
	if err != nil || code != 200 {
		t.Fatalf("request to the paused sandbox's endpoint: %d %q %v", code, body, err)
	}
	t.Logf("endpoint request that resumed the sandbox: %v", time.Since(t0))
	got := parseCounter(t, body)
	if got.boot != first.boot || got.count != first.count+1 || got.value != "kept" {
		t.Errorf("after auto-resume on endpoint traffic: %+v, want boot %s count %d value kept", got, first.boot, first.count+1)
	}
	if st := pg.stateOf(t, id); st.GetState() != sandboxv1.State_STATE_RUNNING {
		t.Errorf("after the request: %s, want RUNNING", st.GetState())
	}

	// Auto-resume off: the edge answers 503 and the sandbox stays paused.
	off := false
	if ps := pg.pause(t, id, &off); ps.GetAutoResume() {
		t.Errorf("pause with auto_resume false: %v", ps)
	}
	for i := 0; i < 2; i++ {
		code, body, err := pg.get(pg.url(id))
		if err != nil || code != http.StatusServiceUnavailable {
			t.Errorf("request to a paused sandbox without auto-resume: %d %q %v, want 503", code, body, err)
		}
	}
	if st := pg.stateOf(t, id); st.GetState() != sandboxv1.State_STATE_PAUSED {
		t.Errorf("after requests without auto-resume: %s, want PAUSED", st.GetState())
	}
	if _, err := pg.state.ResumeSandbox(ctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id})); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := pg.counter(t, id); got.boot != first.boot || got.count != first.count+2 {
		t.Errorf("after the explicit resume: %+v, want boot %s count %d (the refused requests never reached it)", got, first.boot, first.count+2)
	}
}

// TestForkTenWithEndpoints: ten forks of a running sandbox with an endpoint each run with
// their own address and endpoint, continue from the source's memory independently, are
// listed in the caller's organization only, and leave nothing behind once deleted
// (startedStack checks).
func TestForkTenWithEndpoints(t *testing.T) {
	pg := startPauseGateway(t, `{`+gvisorPolicy+`}`)
	ctx := context.Background()
	src := pg.create(t, counterSpec(), "").SandboxId
	pg.waitState(t, src, sandboxv1.State_STATE_RUNNING)
	pg.sh(t, src, "echo source > /tmp/v")
	before := pg.counter(t, src)

	t0 := time.Now()
	res, err := pg.state.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: src, Count: 10}))
	if err != nil {
		t.Fatalf("fork x10: %v", err)
	}
	t.Logf("fork x10: %v", time.Since(t0))
	forks := res.Msg.GetForks()
	if len(forks) != 10 {
		t.Fatalf("%d forks, want 10", len(forks))
	}
	ips := map[string]string{runnerSandbox(t, pg, src).IP: src}
	var ids []string
	for i, f := range forks {
		if f.GetError() != nil {
			t.Fatalf("fork %d: %v", i, f.GetError())
		}
		id := f.GetSandboxId()
		ids = append(ids, id)
		st := pg.waitState(t, id, sandboxv1.State_STATE_RUNNING)
		if u := st.GetStatus().GetServices(); len(u) != 1 || u[0].GetEndpoint().GetUrl() != strings.TrimSuffix(pg.url(id), "/") {
			t.Errorf("fork %s services %v, want its own endpoint %s", id, u, pg.url(id))
		}
		ip := runnerSandbox(t, pg, id).IP
		if other, dup := ips[ip]; dup {
			t.Errorf("fork %s has IP %s, as %s", id, ip, other)
		}
		ips[ip] = id
	}
	// Each fork its own value, written by exec, read back through its own endpoint.
	for i, id := range ids {
		pg.sh(t, id, fmt.Sprintf("echo fork%d > /tmp/v", i))
	}
	for i, id := range ids {
		got := pg.counter(t, id)
		if got.boot != before.boot || got.count != before.count+1 || got.value != fmt.Sprintf("fork%d", i) {
			t.Errorf("fork %d (%s) endpoint: %+v, want boot %s count %d value fork%d", i, id, got, before.boot, before.count+1, i)
		}
	}
	if got := pg.counter(t, src); got.boot != before.boot || got.count != before.count+1 || got.value != "source" {
		t.Errorf("source after the forks: %+v, want boot %s count %d value source", got, before.boot, before.count+1)
	}

	listed := map[string]bool{}
	list, err := pg.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list.Msg.GetSandboxes() {
		listed[sb.GetSandboxId()] = true
	}
	for _, id := range ids {
		if !listed[id] {
			t.Errorf("fork %s not in the caller's ListSandboxes", id)
		}
	}
	other, err := pg.other.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil || len(other.Msg.GetSandboxes()) != 0 {
		t.Errorf("another organization lists %d sandboxes (%v), want none", len(other.Msg.GetSandboxes()), err)
	}
	for _, id := range ids {
		if _, err := pg.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
			t.Fatalf("delete fork %s: %v", id, err)
		}
	}
	for _, id := range ids {
		pg.waitState(t, id, sandboxv1.State_STATE_TERMINATED)
		if code, _, err := pg.get(pg.url(id)); err != nil || code != 404 {
			t.Errorf("endpoint of deleted fork %s: %d %v, want 404", id, code, err)
		}
	}
	if got := pg.counter(t, src); got.boot != before.boot || got.count != before.count+2 {
		t.Errorf("source after the forks were deleted: %+v", got)
	}
}

// TestIdlePause: a policy's base.pause.idle_pause_seconds (at least 60) pauses a sandbox
// nobody uses after that long; an exec then resumes it, its memory intact.
func TestIdlePause(t *testing.T) {
	if testing.Short() {
		t.Skip("waits the minimum idle time (60 s)")
	}
	pg := startPauseGateway(t, `{"base": {"pause": {"idle_pause_seconds": 60}}, `+gvisorPolicy+`}`)
	id := pg.create(t, counterSpec(), "").SandboxId
	pg.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	pg.sh(t, id, "echo idle > /tmp/v")
	first := pg.counter(t, id)
	lastUse := time.Now()

	for {
		st := pg.stateOf(t, id)
		if st.GetState() == sandboxv1.State_STATE_PAUSED {
			break
		}
		if st.GetState() != sandboxv1.State_STATE_RUNNING {
			t.Fatalf("while idle: %s (%s)", st.GetState(), st.GetStateReason())
		}
		if time.Since(lastUse) > 90*time.Second {
			t.Fatalf("not paused %v after its last use (idle_pause_seconds 60)", time.Since(lastUse))
		}
		time.Sleep(time.Second)
	}
	idle := time.Since(lastUse)
	t.Logf("paused %v after the last use", idle)
	if idle < 59*time.Second {
		t.Errorf("paused after %v idle, before idle_pause_seconds (60)", idle)
	}
	if pause := runnerSandbox(t, pg, id).Pause; pause == nil || !pause.Released || !pause.AutoResume {
		t.Errorf("idle pause status %+v: want a checkpoint that resumes by itself", pause)
	}
	// An exec resumes it; the server's memory is intact.
	if out := pg.sh(t, id, "cat /tmp/v"); out != "idle\n" {
		t.Errorf("exec after the idle pause: %q", out)
	}
	if st := pg.stateOf(t, id); st.GetState() != sandboxv1.State_STATE_RUNNING {
		t.Errorf("after exec: %s, want RUNNING", st.GetState())
	}
	if got := pg.counter(t, id); got.boot != first.boot || got.count != first.count+1 {
		t.Errorf("server after the idle pause: %+v, want boot %s count %d", got, first.boot, first.count+1)
	}
}

// TestPauseLifetime: with base.pause.lifetime HELD the deadline moves on by the time
// paused; with COUNTS (the default) a sandbox whose lifetime ends while paused ends
// COMPLETED LifetimeExceeded without running again.
func TestPauseLifetime(t *testing.T) {
	t.Run("held", func(t *testing.T) {
		pg := startPauseGateway(t, `{"base": {"pause": {"lifetime": "HELD"}}, `+gvisorPolicy+`}`)
		sp := counterSpec()
		sp.MaxLifetimeSeconds = 600
		id := pg.create(t, sp, "").SandboxId
		pg.waitState(t, id, sandboxv1.State_STATE_RUNNING)
		before := runnerSandbox(t, pg, id).Deadline
		ps := pg.pause(t, id, nil)
		if !ps.GetLifetimeHeld() {
			t.Errorf("pause status %v: want lifetime_held", ps)
		}
		pausedAt := time.Now()
		time.Sleep(3 * time.Second)
		res, err := pg.state.ResumeSandbox(context.Background(), connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		paused := time.Since(pausedAt)
		after := res.Msg.GetDeadline().AsTime()
		moved := after.Sub(before)
		if moved < 3*time.Second || moved > paused+2*time.Second {
			t.Errorf("deadline moved by %v (from %v to %v), want about the %v paused", moved, before, after, paused)
		}
		if d := runnerSandbox(t, pg, id).Deadline; !d.Equal(after) {
			t.Errorf("runner deadline %v, resume answered %v", d, after)
		}
		if got := pg.stateOf(t, id).GetEffectiveMaxLifetimeSeconds(); got < 603 {
			t.Errorf("effective max lifetime %d s after the hold, want at least 603", got)
		}
	})

	t.Run("counts", func(t *testing.T) {
		pg := startPauseGateway(t, `{`+gvisorPolicy+`}`)
		sp := counterSpec()
		sp.MaxLifetimeSeconds = 20
		id := pg.create(t, sp, "").SandboxId
		pg.waitState(t, id, sandboxv1.State_STATE_RUNNING)
		pg.counter(t, id)
		if ps := pg.pause(t, id, nil); ps.GetLifetimeHeld() {
			t.Errorf("pause status %v: lifetime held by default", ps)
		}
		// Every state the runner reports from now on (it notifies each change).
		deadline := runnerSandbox(t, pg, id).Deadline
		var seen []runner.State
		for {
			changed := pg.stack.Runner.Changed()
			sb := runnerSandbox(t, pg, id)
			if len(seen) == 0 || seen[len(seen)-1] != sb.State {
				seen = append(seen, sb.State)
			}
			if sb.State.Terminal() {
				break
			}
			select {
			case <-changed:
			case <-time.After(time.Until(deadline.Add(30 * time.Second))):
				t.Fatalf("still %s 30 s after its deadline", sb.State)
			}
		}
		for _, s := range seen {
			if s == runner.StateRunning {
				t.Errorf("states after the pause %v: it ran again", seen)
			}
		}
		t.Logf("states after the pause: %v", seen)
		if st := pg.stateOf(t, id); st.GetState() != sandboxv1.State_STATE_COMPLETED || !strings.HasPrefix(st.GetStateReason(), runner.ReasonLifetimeExceeded) {
			t.Errorf("paused sandbox past its lifetime: %s (%s), want COMPLETED %s", st.GetState(), st.GetStateReason(), runner.ReasonLifetimeExceeded)
		}
		_, err := pg.state.ResumeSandbox(context.Background(), connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) == "" {
			t.Errorf("resume of the expired sandbox: %v, want FAILED_PRECONDITION with a reason", err)
		}
	})
}

// runnerSandbox is the runner's view of sandbox id.
func runnerSandbox(t *testing.T, pg *pauseGateway, id string) runner.Sandbox {
	t.Helper()
	sb, err := pg.stack.Runner.Get(id)
	if err != nil {
		t.Fatalf("runner get %s: %v", id, err)
	}
	return sb
}
