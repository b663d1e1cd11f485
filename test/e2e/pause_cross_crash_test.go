package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/minio/minio-go/v7"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

// Moves and cross-runner forks with a runner killed (SIGKILL at a failpoint) at each
// step: two `sandboxd runner` processes sharing one SeaweedFS bucket as their blob
// store, a gateway in the test with both.

// xcrashRunner is one `sandboxd runner` process of the rig, started again on the same
// data dir after it is killed.
type xcrashRunner struct {
	id      string
	cgroups string // its cgroup parent
	bin     string
	args    []string
	dataDir string
	proc    *runnerProc
	rc      *runnerapi.Client
}

// xcrashRig is the two runners, the bucket and the gateway. It embeds a crashRig (its
// gateway clients only) for exec, counter and settled.
type xcrashRig struct {
	crashRig
	e      *fssS3
	r1, r2 *xcrashRunner
}

// start starts the runner set to kill itself at failpoint point ("" for none) and waits
// until it listens.
func (x *xcrashRunner) start(t *testing.T, point string) {
	t.Helper()
	p := &runnerProc{cmd: exec.Command(x.bin, x.args...), exited: make(chan struct{}), out: new(logbuf.Buffer)}
	p.cmd.Env = append(os.Environ(), "SANDBOXD_AGENT="+env.AgentBin)
	if point != "" {
		p.cmd.Env = append(p.cmd.Env, failpoint.Env+"="+point)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	x.proc = p
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.out.String(), "runner "+x.id+" listening on") {
		select {
		case <-p.exited:
			t.Fatalf("runner %s exited early:\n%s", x.id, p.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop(syscall.SIGKILL)
			t.Fatalf("runner %s not listening after 60 s:\n%s", x.id, p.out.String())
		}
	}
}

// restart stops the runner cleanly (its sandboxes live on) and starts it set to kill
// itself at point.
func (x *xcrashRunner) restart(t *testing.T, point string) {
	t.Helper()
	x.proc.stop(syscall.SIGTERM)
	x.start(t, point)
}

// killedBy runs op (a call through the gateway) until the runner dies at its failpoint
// (calls answered UNAVAILABLE before, while the gateway has not seen the restarted
// runner yet, are retried) and returns op's error. The runner stays dead: the caller
// starts it again.
func (x *xcrashRunner) killedBy(t *testing.T, point string, op func(ctx context.Context) error) error {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := op(ctx)
		cancel()
		select {
		case <-x.proc.exited:
		case <-time.After(2 * time.Second):
			if err == nil || connect.CodeOf(err) != connect.CodeUnavailable || time.Now().After(deadline) {
				t.Fatalf("failpoint %s: runner %s was not killed (the call returned %v)", point, x.id, err)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		ws, _ := x.proc.cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("failpoint %s: runner %s exited with %v, want SIGKILL:\n%s", point, x.id, x.proc.cmd.ProcessState, x.proc.out.String())
		}
		return err
	}
}

// list is what the runner has (retried while the gateway's client reconnects).
func (x *xcrashRunner) list(t *testing.T) []runner.Sandbox {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sbs, err := x.rc.List(context.Background())
		if err == nil {
			return sbs
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner %s: list: %v", x.id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dead: the runner's process has exited.
func (x *xcrashRunner) dead() bool {
	select {
	case <-x.proc.exited:
		return true
	default:
		return false
	}
}

// live are the sandboxes with ID id the runner lists that have not ended (none while
// it is dead).
func (x *xcrashRunner) live(t *testing.T, id string) []runner.Sandbox {
	t.Helper()
	var out []runner.Sandbox
	if x.dead() {
		return nil
	}
	for _, sb := range x.list(t) {
		if sb.ID == id && !sb.State.Terminal() {
			out = append(out, sb)
		}
	}
	return out
}

// leftovers is what the runner's data dir holds of sandboxes: sandbox dirs, checkpoint
// import staging dirs, mounts (the network's netns dir itself aside), netns and network
// records, the runner's records (lifetimes, pauses, moves), loop devices.
func (x *xcrashRunner) leftovers() []string {
	var out []string
	sandboxes := filepath.Join(x.dataDir, "sandboxes")
	ents, _ := os.ReadDir(sandboxes)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, "sandbox dir "+e.Name())
		}
	}
	staged, _ := os.ReadDir(filepath.Join(sandboxes, ".imports"))
	for _, e := range staged {
		out = append(out, "import staging dir "+e.Name())
	}
	holder := filepath.Join(x.dataDir, "network", "mntns") // the namespaces' holder (network/holder.go)
	for _, mp := range stacktest.MountsUnder(x.dataDir) {
		if mp != holder {
			out = append(out, "mount "+mp)
		}
	}
	held, err := network.HeldNetNS(filepath.Join(x.dataDir, "network")) // not through netns: a dead runner's link
	if err != nil {
		out = append(out, "network namespaces: "+err.Error())
	}
	for _, id := range held {
		out = append(out, "network netns "+id)
	}
	ents, _ = os.ReadDir(filepath.Join(x.dataDir, "network", "sandboxes"))
	for _, e := range ents {
		out = append(out, "network sandboxes "+e.Name())
	}
	for _, d := range []string{"lifetimes", "paused", "moved"} { // the runner's records
		ents, _ := os.ReadDir(filepath.Join(x.dataDir, "runner", d))
		for _, e := range ents {
			out = append(out, "runner record "+d+"/"+e.Name())
		}
	}
	for _, l := range stacktest.LingeringLoops(x.dataDir) {
		out = append(out, "loop device "+l)
	}
	return out
}

// xcrashCgroups are the cgroups under parent.
func xcrashCgroups(parent string) []string {
	var out []string
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent + "/*")
	for _, c := range cgroups {
		if fi, err := os.Stat(c); err == nil && fi.IsDir() {
			out = append(out, c)
		}
	}
	return out
}

func startXCrashRig(t *testing.T) *xcrashRig {
	t.Helper()
	needRunsc(t)
	if testing.Short() {
		t.Skip("kills and restarts runner processes")
	}
	e := newFSSS3(t) // skips without SeaweedFS (unless SANDBOXD_REQUIRE_S3=1)
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandboxd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sandboxd/sandboxd/cmd/sandboxd").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for name, v := range map[string]string{"ak": e.srv.AccessKey, "sk": e.srv.SecretKey} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	x := &xcrashRig{e: e}
	var handles []runner.Handle
	// Stacks 3 and 4: their own bridges, subnets and cgroup parents (others use 0 to 2).
	for i, id := range []string{"r1", "r2"} {
		r := &xcrashRunner{id: id, bin: bin, dataDir: filepath.Join(dir, id+"-data")}
		pkiDir := filepath.Join(dir, id+"-pki")
		sc := env.StackConfigN(r.dataDir, 3+i)
		r.cgroups = sc.CgroupParent
		addr := freeAddr(t)
		r.args = []string{"runner", "--data-dir", r.dataDir, "--pki-dir", pkiDir, "--listen", addr, "--runner-id", id,
			"--insecure-registry", env.Registry, "--bridge", sc.Bridge, "--subnet", sc.Subnet.String(),
			"--cgroup-parent", sc.CgroupParent, "--no-egress",
			"--blob-s3-endpoint", e.srv.Endpoint, "--blob-s3-bucket", e.bucket, "--blob-s3-path-style", "--blob-s3-insecure",
			"--blob-s3-access-key-file", filepath.Join(dir, "ak"), "--blob-s3-secret-key-file", filepath.Join(dir, "sk")}
		r.start(t, "")
		t.Cleanup(func() {
			if r.proc != nil {
				r.proc.stop(syscall.SIGTERM)
				if t.Failed() {
					t.Logf("runner %s output:\n%s", id, r.proc.out.String())
				}
			}
			if procs := processesUsing(r.dataDir); len(procs) > 0 {
				t.Errorf("runner %s: processes left after it stopped: %q", id, procs)
			}
			if left := stacktest.Leftovers(r.dataDir); len(left) > 0 {
				t.Errorf("runner %s: left behind after it stopped: %q", id, left)
			}
			for _, c := range xcrashCgroups(sc.CgroupParent) {
				t.Errorf("runner %s: leaked cgroup: %s", id, c)
			}
			stacktest.ForceClean(r.dataDir)
			if nw, err := network.New(network.Config{Bridge: sc.Bridge, Subnet: sc.Subnet, Table: sc.NetTable,
				StateDir: filepath.Join(r.dataDir, "network"), Nameservers: []string{}}); err == nil {
				if err := nw.Cleanup(); err != nil {
					t.Errorf("runner %s: network cleanup: %v", id, err)
				}
			}
			parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + sc.CgroupParent)
			for _, p := range parents {
				_ = os.Remove(p)
			}
		})
		ca, err := pki.LoadOrCreateCA(pkiDir, "sandboxd platform CA")
		if err != nil {
			t.Fatal(err)
		}
		clientTLS, err := runnerapi.ClientTLSConfig(ca, "gw-test", id)
		if err != nil {
			t.Fatal(err)
		}
		if r.rc, err = runnerapi.NewClient(runnerapi.ClientConfig{ID: id, Addr: addr, TLS: clientTLS}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.rc.Close)
		handles = append(handles, r.rc)
		if i == 0 {
			x.r1 = r
		} else {
			x.r2 = r
		}
	}
	pol := &policies{}
	pol.set(`{` + gvisorPolicy + `}`)
	gwy, err := gateway.New(gateway.Config{Auth: e.keys, Runners: handles, Policies: pol,
		Index: e.st.Sandboxes(), Orgs: e.st.Orgs(), OrphanGrace: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(gwy.Handler())
	srv.EnableHTTP2 = true
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	x.g = gwClients(srv.URL, e.keyA, e.keyB)
	x.gwy = gwy
	x.state = statev1connect.NewSandboxStateServiceClient(h2cClient(), srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(e.keyA)))
	return x
}

// checkpointObjects lists the bucket's objects under checkpoints/.
func (x *xcrashRig) checkpointObjects(t *testing.T) []string {
	t.Helper()
	var out []string
	for oi := range x.e.srv.Client.ListObjects(context.Background(), x.e.bucket, minio.ListObjectsOptions{Prefix: "checkpoints/", Recursive: true}) {
		if oi.Err != nil {
			t.Fatalf("list objects: %v", oi.Err)
		}
		out = append(out, oi.Key)
	}
	return out
}

// noManifests checks that no checkpoint in the bucket is complete (has its manifest):
// every move and fork deletes its export when it ends, whatever happened; what a killed
// exporter left (parts without a manifest) nothing reads.
func (x *xcrashRig) noManifests(t *testing.T, what string) []string {
	t.Helper()
	objs := x.checkpointObjects(t)
	for _, k := range objs {
		if strings.HasSuffix(k, "/manifest.json") {
			t.Errorf("%s: a complete checkpoint is left in the bucket: %s (all: %q)", what, k, objs)
		}
	}
	return objs
}

// pause pauses sandbox id releasing its resources (a checkpoint).
func (x *xcrashRig) pause(t *testing.T, id string) {
	t.Helper()
	release := true
	res, err := x.state.PauseSandbox(context.Background(), connect.NewRequest(&statev1.PauseSandboxRequest{SandboxId: id, ReleaseResources: &release}))
	if err != nil {
		t.Fatalf("pause %s: %v", id, err)
	}
	if !res.Msg.GetStatus().GetResourcesReleased() {
		t.Fatalf("pause %s: resources not released: %v", id, res.Msg.GetStatus())
	}
}

// resume resumes sandbox id on one of runners (none: where it is), retrying while a
// runner the gateway needs is not connected yet.
func (x *xcrashRig) resume(t *testing.T, id string, runners ...string) (*statev1.ResumeSandboxResponse, error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		res, err := x.state.ResumeSandbox(ctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id, RunnerIds: runners}))
		cancel()
		if err == nil {
			return res.Msg, nil
		}
		if connect.CodeOf(err) != connect.CodeUnavailable || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// wantOn checks the state is true: the gateway says sandbox id is state on runner on,
// and of both runners only on lists it (not ended), in that state.
func (x *xcrashRig) wantOn(t *testing.T, what, id, on string, state sandboxv1.State) {
	t.Helper()
	st := x.settled(t, id)
	if st == nil {
		t.Fatalf("%s: sandbox %s is gone", what, id)
	}
	if st.GetState() != state || st.GetRunnerId() != on {
		t.Errorf("%s: sandbox %s is %s (%s) on runner %q, want %s on %s", what, id, st.GetState(), st.GetStateReason(), st.GetRunnerId(), state, on)
	}
	want := runner.StateRunning
	if state == sandboxv1.State_STATE_PAUSED {
		want = runner.StatePaused
	}
	for _, r := range []*xcrashRunner{x.r1, x.r2} {
		if r.dead() {
			continue
		}
		live := r.live(t, id)
		switch {
		case r.id == on && (len(live) != 1 || live[0].State != want):
			t.Errorf("%s: runner %s lists %s as %v, want one %s", what, r.id, id, xcrashStates(live), want)
		case r.id == on && want == runner.StatePaused && (live[0].Pause == nil || !live[0].Pause.Released):
			t.Errorf("%s: runner %s has %s paused without a checkpoint: %+v", what, r.id, id, live[0].Pause)
		case r.id != on && len(live) > 0:
			t.Errorf("%s: runner %s lists %s as %v too (a second copy)", what, r.id, id, xcrashStates(live))
		}
	}
}

func xcrashStates(sbs []runner.Sandbox) []string {
	out := []string{}
	for _, sb := range sbs {
		out = append(out, sb.State.String())
	}
	return out
}

// TestPauseCrossCrash kills a runner (SIGKILL at a failpoint) at each step of a move of
// a checkpointed sandbox to another runner and of a fork onto another runner, and
// starts it again on its data dir. Afterwards the state is true: the sandbox is PAUSED
// on its runner with a usable checkpoint (it resumes there with its memory intact, or
// moves on a retry), never PAUSED without one, never listed by both runners; the
// importing runner keeps nothing of a cut-short import (no sandbox, staging dir, mount,
// netns, cgroup); a fork cut short leaves nothing running; no complete checkpoint is
// left in the bucket.
func TestPauseCrossCrash(t *testing.T) {
	x := startXCrashRig(t)
	ctx := context.Background()

	sp := counterSpec2()
	sp.RunnerIds = []string{"r1"}
	src := x.g.createRetrying(t, sp).SandboxId
	x.g.waitState(t, src, sandboxv1.State_STATE_RUNNING)
	t.Cleanup(func() {
		_, _ = x.g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: src}))
		deadline := time.Now().Add(60 * time.Second)
		for _, r := range []*xcrashRunner{x.r1, x.r2} {
			for len(r.live(t, src)) > 0 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if live := r.live(t, src); len(live) > 0 {
				t.Errorf("runner %s: %s still %v after its delete", r.id, src, xcrashStates(live))
			}
		}
		deadline = time.Now().Add(30 * time.Second)
		for _, r := range []*xcrashRunner{x.r1, x.r2} {
			for len(r.leftovers()) > 0 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if left := r.leftovers(); len(left) > 0 {
				t.Errorf("runner %s: left after every sandbox was deleted: %q", r.id, left)
			}
		}
		if objs := x.checkpointObjects(t); len(objs) > 0 {
			t.Errorf("left in the bucket at the end: %q", objs)
		}
	})
	if _, err := x.exec(src, "echo v"+src[:4]+" > /tmp/v"); err != nil {
		t.Fatal(err)
	}
	cur, err := x.counter(t, src)
	if err != nil {
		t.Fatal(err)
	}
	// The leak checks see a running sandbox (else they could not fail).
	if left := x.r1.leftovers(); len(left) < 3 || len(xcrashCgroups(x.r1.cgroups)) == 0 {
		t.Errorf("with a sandbox running on r1 the leak checks see only %q, cgroups %q", left, xcrashCgroups(x.r1.cgroups))
	} else {
		t.Logf("a running sandbox on r1: %q", left)
	}
	// next checks that the server of src continues where it was (its memory intact).
	next := func(t *testing.T, what string) {
		t.Helper()
		got, err := x.counter(t, src)
		if err != nil {
			t.Fatalf("%s: the sandbox does not answer: %v", what, err)
		}
		if got.boot != cur.boot || got.count != cur.count+1 || got.value != cur.value {
			t.Errorf("%s: server state %+v, want boot %s count %d value %s (memory intact)", what, got, cur.boot, cur.count+1, cur.value)
		}
		cur = got
	}

	// A fork onto r2 from the running source on r1, r2 killed once the fork's entries
	// are made (before its backend is called): the forks fail, the source runs on, and
	// the restarted r2 runs nothing of them.
	t.Run("fork onto r2, r2 killed at runner.import.created", func(t *testing.T) {
		const point = "runner.import.created"
		x.r2.restart(t, point)
		var forks []*statev1.Fork
		err := x.r2.killedBy(t, point, func(ctx context.Context) error {
			res, err := x.state.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: src, Count: 2, RunnerIds: []string{"r2"}}))
			if err == nil {
				forks = res.Msg.GetForks()
				for _, f := range forks {
					if f.GetError() == nil {
						t.Errorf("fork %s made on %s although its runner was killed", f.GetSandboxId(), f.GetRunnerId())
					}
				}
			}
			return err
		})
		switch {
		case err != nil:
			t.Logf("fork with r2 killed: %v", err)
		case len(forks) != 2:
			t.Errorf("fork with r2 killed: %d results, want 2 (with errors) or an error", len(forks))
		default:
			t.Logf("fork with r2 killed: results %v", forks)
		}
		x.wantOn(t, "r2 dead", src, "r1", sandboxv1.State_STATE_RUNNING)
		next(t, "r2 dead")
		x.r2.start(t, "")
		for _, sb := range x.r2.list(t) {
			st := x.settled(t, sb.ID)
			t.Logf("after r2 restarted it has %s %s (gateway: %v)", sb.ID, sb.State, st)
			if !sb.State.Terminal() {
				t.Errorf("after r2 restarted: %s is %s there (half-made fork)", sb.ID, sb.State)
			} else if sb.Reason == "" {
				t.Errorf("after r2 restarted: %s is %s without a reason", sb.ID, sb.State)
			}
		}
		list, err := x.g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range list.Msg.GetSandboxes() {
			if sb.SandboxId == src {
				continue
			}
			switch st := x.settled(t, sb.SandboxId); {
			case st == nil:
			case st.GetState() == sandboxv1.State_STATE_FAILED || st.GetState() == sandboxv1.State_STATE_TERMINATED:
				if st.GetStateReason() == "" {
					t.Errorf("fork %s %s without a reason", sb.SandboxId, st.GetState())
				}
			default:
				t.Errorf("fork %s cut short is %s on %s: want ended with a reason, or absent", sb.SandboxId, st.GetState(), st.GetRunnerId())
			}
		}
		if left := x.r2.leftovers(); len(left) > 0 {
			t.Errorf("r2 after the restart: %q", left)
		}
		if cg := xcrashCgroups(x.r2.cgroups); len(cg) > 0 {
			t.Errorf("r2 after the restart: cgroups %q", cg)
		}
		x.wantOn(t, "r2 restarted", src, "r1", sandboxv1.State_STATE_RUNNING)
		next(t, "r2 restarted")
		if objs := x.checkpointObjects(t); len(objs) > 0 {
			t.Errorf("the fork's export is left in the bucket: %q", objs)
		}
	})

	move := func(t *testing.T) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			res, err := x.state.ResumeSandbox(ctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: src, RunnerIds: []string{"r2"}}))
			if err == nil {
				t.Errorf("the move succeeded (to %s) although a runner was killed", res.Msg.GetRunnerId())
			}
			return err
		}
	}

	// The exporting runner r1 killed: after the image part is up, and after every part
	// is up but before the manifest. The sandbox is PAUSED on r1 with its checkpoint; it
	// resumes there with its memory intact.
	for _, point := range []string{"local.export.image", "runner.export.uploaded"} {
		t.Run("move to r2, r1 killed at "+point, func(t *testing.T) {
			x.pause(t, src)
			before := x.checkpointObjects(t)
			x.r1.restart(t, point)
			err := x.r1.killedBy(t, point, move(t))
			t.Logf("move with r1 killed: %v", err)
			if err == nil || !strings.Contains(err.Error(), src) && !strings.Contains(err.Error(), "r1") {
				t.Errorf("move with r1 killed: error %v, want one naming the sandbox or its runner", err)
			}
			objs := x.checkpointObjects(t)
			var parts []string
			for _, k := range objs {
				if !slices.Contains(before, k) {
					parts = append(parts, k)
				}
			}
			if len(parts) == 0 {
				t.Errorf("nothing of the export in the bucket when r1 died (the test's premise)")
			}
			t.Logf("left in the bucket by the killed export: %q", parts)
			if live := x.r2.live(t, src); len(live) > 0 {
				t.Errorf("r2 has %s (%v) although the export never finished", src, xcrashStates(live))
			}
			x.r1.start(t, "")
			x.wantOn(t, "r1 restarted", src, "r1", sandboxv1.State_STATE_PAUSED)
			x.noManifests(t, point)
			// The restarted r1 removes what the killed export left (its sandbox's
			// parts without a manifest).
			deadline := time.Now().Add(30 * time.Second)
			for len(x.checkpointObjects(t)) > len(before) && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if objs := x.checkpointObjects(t); len(objs) > len(before) {
				t.Errorf("left in the bucket after r1 restarted: %q (before the move: %q)", objs, before)
			}
			res, err := x.resume(t, src)
			if err != nil {
				t.Fatalf("sandbox PAUSED without a usable checkpoint: resume: %v", err)
			}
			if res.GetRunnerId() != "r1" || res.GetMovedFrom() != "" {
				t.Errorf("plain resume: on %q moved from %q, want on r1", res.GetRunnerId(), res.GetMovedFrom())
			}
			x.wantOn(t, "resumed", src, "r1", sandboxv1.State_STATE_RUNNING)
			next(t, "resumed on r1")
		})
	}

	// The importing runner r2 killed: after the parts are staged (before the restore),
	// and once the sandbox's entry is made (before its backend is called). The sandbox
	// stays PAUSED on r1; r2 keeps nothing of it; a retry once r2 is back moves it. Then
	// it moves back to r1 for the next case.
	for i, point := range []string{"local.import.staged", "runner.import.created"} {
		t.Run("move to r2, r2 killed at "+point, func(t *testing.T) {
			x.pause(t, src)
			before := x.checkpointObjects(t)
			x.r2.restart(t, point)
			err := x.r2.killedBy(t, point, move(t))
			t.Logf("move with r2 killed: %v", err)
			if err == nil {
				t.Fatal("the move did not fail")
			}
			x.wantOn(t, "r2 dead", src, "r1", sandboxv1.State_STATE_PAUSED)
			if staged, _ := os.ReadDir(filepath.Join(x.r2.dataDir, "sandboxes", ".imports")); point == "local.import.staged" && len(staged) == 0 {
				t.Errorf("no import staging dir on r2 when it died (the test's premise)")
			}
			x.r2.start(t, "")
			if live := x.r2.live(t, src); len(live) > 0 {
				t.Errorf("r2 restarted has %s: %v", src, xcrashStates(live))
			}
			if left := x.r2.leftovers(); len(left) > 0 {
				t.Errorf("r2 restarted: left of the cut-short import: %q", left)
			}
			if cg := xcrashCgroups(x.r2.cgroups); len(cg) > 0 {
				t.Errorf("r2 restarted: cgroups %q", cg)
			}
			x.wantOn(t, "r2 restarted", src, "r1", sandboxv1.State_STATE_PAUSED)
			// The move deleted its export (r1 lived on): nothing new in the bucket.
			for _, k := range x.checkpointObjects(t) {
				if !slices.Contains(before, k) {
					t.Errorf("left in the bucket by the failed move: %s", k)
				}
			}

			res, err := x.resume(t, src, "r2")
			if err != nil {
				t.Fatalf("move again once r2 is back: %v", err)
			}
			if res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" {
				t.Errorf("move again: on %q moved from %q, want on r2 from r1", res.GetRunnerId(), res.GetMovedFrom())
			}
			x.wantOn(t, "moved", src, "r2", sandboxv1.State_STATE_RUNNING)
			next(t, "moved to r2")
			if i == 0 {
				x.pause(t, src)
				if _, err := x.resume(t, src, "r1"); err != nil {
					t.Fatalf("move back to r1: %v", err)
				}
				x.wantOn(t, "moved back", src, "r1", sandboxv1.State_STATE_RUNNING)
				next(t, "moved back to r1")
			}
			x.noManifests(t, "after the moves")
		})
	}
}
