package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// crashRig is a split deployment: a gateway in the test and a `sandboxd runner` process
// the test kills (SIGKILL at a failpoint of the local backend) and starts again on the
// same data dir.
type crashRig struct {
	bin     string
	args    []string
	dataDir string
	proc    *runnerProc
	g       *gw
	state   statev1connect.SandboxStateServiceClient
	gwy     *gateway.Server
	rc      *runnerapi.Client
}

func startCrashRig(t *testing.T) *crashRig {
	t.Helper()
	dir := t.TempDir()
	r := &crashRig{bin: filepath.Join(dir, "sandboxd"), dataDir: filepath.Join(dir, "runner")}
	if out, err := exec.Command("go", "build", "-o", r.bin, "github.com/sandboxd/sandboxd/cmd/sandboxd").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pkiDir := filepath.Join(dir, "pki")
	sc := env.StackConfigN(r.dataDir, 2) // its own bridge, subnet and cgroup parent
	addr := freeAddr(t)
	r.args = []string{"runner", "--data-dir", r.dataDir, "--pki-dir", pkiDir, "--listen", addr, "--runner-id", "r1",
		"--insecure-registry", env.Registry, "--bridge", sc.Bridge, "--subnet", sc.Subnet.String(),
		"--cgroup-parent", sc.CgroupParent, "--no-egress"}
	r.proc = startRunnerProc(t, r.bin, r.args...)
	t.Cleanup(func() {
		if r.proc != nil {
			r.proc.stop(syscall.SIGTERM)
			if t.Failed() {
				t.Logf("runner output:\n%s", r.proc.out.String())
			}
		}
		if procs := processesUsing(r.dataDir); len(procs) > 0 {
			t.Errorf("processes left after the runner stopped: %q", procs)
		}
		if left := stacktest.Leftovers(r.dataDir); len(left) > 0 {
			t.Errorf("left behind after the runner stopped: %q", left)
		}
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + sc.CgroupParent + "/*")
		for _, c := range cgroups {
			if fi, err := os.Stat(c); err == nil && fi.IsDir() {
				t.Errorf("leaked cgroup: %s", c)
			}
		}
		stacktest.ForceClean(r.dataDir)
		if nw, err := network.New(network.Config{Bridge: sc.Bridge, Subnet: sc.Subnet, Table: sc.NetTable,
			StateDir: filepath.Join(r.dataDir, "network"), Nameservers: []string{}}); err == nil {
			if err := nw.Cleanup(); err != nil {
				t.Errorf("network cleanup: %v", err)
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
	clientTLS, err := runnerapi.ClientTLSConfig(ca, "gw-test", "r1")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: "r1", Addr: addr, TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	// A store-backed index, as in production: its reconciler deletes sandboxes no gateway
	// recorded (a fork the runner made whole but never reported); the test runs it.
	st, keys, keyA := indexStore(t)
	if _, err := st.Orgs().Create(context.Background(), store.Org{ID: "org-b"}); err != nil {
		t.Fatal(err)
	}
	keyB, _, _ := keys.Create("org-b", auth.RoleUser, "")
	pol := &policies{}
	pol.set(`{` + gvisorPolicy + `}`)
	gwy, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{rc}, Policies: pol,
		Index: st.Sandboxes(), Orgs: st.Orgs(), OrphanGrace: time.Nanosecond})
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
	r.g = gwClients(srv.URL, keyA, keyB)
	r.gwy, r.rc = gwy, rc
	r.state = statev1connect.NewSandboxStateServiceClient(h2cClient(), srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(keyA)))
	return r
}

// restart stops the runner cleanly (its sandboxes live on) and starts it again, set to
// kill itself at failpoint point ("" for none).
func (r *crashRig) restart(t *testing.T, point string) {
	t.Helper()
	r.proc.stop(syscall.SIGTERM)
	var extra []string
	if point != "" {
		extra = []string{failpoint.Env + "=" + point}
	}
	r.proc = startRunnerProcEnv(t, r.bin, extra, r.args...)
}

// killedBy runs op (a call through the gateway) until the runner dies at its failpoint:
// calls answered UNAVAILABLE before (the gateway has not seen the restarted runner yet)
// are retried. Then it starts the runner again without a failpoint.
// premise, when not nil, is called with the runner dead, before it starts again.
func (r *crashRig) killedBy(t *testing.T, point string, op func(ctx context.Context) error, premise func()) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := op(ctx)
		cancel()
		select {
		case <-r.proc.exited:
		case <-time.After(2 * time.Second):
			if err == nil || connect.CodeOf(err) != connect.CodeUnavailable || time.Now().After(deadline) {
				t.Fatalf("failpoint %s: the runner was not killed (the call returned %v)", point, err)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		break
	}
	ws, _ := r.proc.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("failpoint %s: the runner exited with %v, want SIGKILL:\n%s", point, r.proc.cmd.ProcessState, r.proc.out.String())
	}
	if premise != nil {
		premise()
	}
	t0 := time.Now()
	r.proc = startRunnerProcEnv(t, r.bin, nil, r.args...)
	t.Logf("%s: runner killed, restarted in %v", point, time.Since(t0))
}

// exec runs script in sandbox id through the gateway (within 60 s).
func (r *crashRig) exec(id, script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := r.g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
	if err != nil {
		return "", err
	}
	if res.Msg.ExitCode != 0 {
		return "", fmt.Errorf("exit %d: %s%s", res.Msg.ExitCode, res.Msg.Stdout, res.Msg.Stderr)
	}
	return string(res.Msg.Stdout), nil
}

const readCounter = `python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8080/").read().decode().strip())'`

// counter reads the counter server of sandbox id from inside it, waiting for it to listen.
func (r *crashRig) counter(t *testing.T, id string) (counterState, error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := r.exec(id, readCounter)
		if err == nil {
			return parseCounter(t, out), nil
		}
		if time.Now().After(deadline) {
			return counterState{}, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// settled is the state of sandbox id once it is no longer in a transition (the runner
// may still be starting: errors are retried).
func (r *crashRig) settled(t *testing.T, id string) *sandboxv1.SandboxStatus {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := r.g.sandboxes.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err == nil {
			switch st := res.Msg.GetStatus(); st.GetState() {
			case sandboxv1.State_STATE_RUNNING, sandboxv1.State_STATE_PAUSED, sandboxv1.State_STATE_FAILED,
				sandboxv1.State_STATE_COMPLETED, sandboxv1.State_STATE_TERMINATED:
				return st
			}
		} else if connect.CodeOf(err) == connect.CodeNotFound {
			return nil
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s did not settle: %v %v", id, res, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// check asserts what a crash may leave of a sandbox whose server was at before: PAUSED
// with a checkpoint that resumes with its memory intact, RUNNING with its memory intact,
// or ended with a reason. It returns whether the sandbox runs (and its server's state).
func (r *crashRig) check(t *testing.T, point, id string, before counterState) (bool, counterState) {
	t.Helper()
	st := r.settled(t, id)
	if st == nil {
		t.Errorf("%s: sandbox %s is gone", point, id)
		return false, before
	}
	t.Logf("%s: sandbox after the restart: %s %s", point, st.GetState(), st.GetStateReason())
	switch st.GetState() {
	case sandboxv1.State_STATE_PAUSED:
		if _, err := r.state.ResumeSandbox(context.Background(), connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: id})); err != nil {
			t.Errorf("%s: sandbox PAUSED without a usable checkpoint: resume: %v", point, err)
			return false, before
		}
	case sandboxv1.State_STATE_RUNNING:
	default:
		if st.GetStateReason() == "" {
			t.Errorf("%s: sandbox %s without a reason", point, st.GetState())
		}
		return false, before
	}
	got, err := r.counter(t, id)
	if err != nil {
		t.Errorf("%s: the %s sandbox does not answer: %v", point, st.GetState(), err)
		return false, before
	}
	if got.boot != before.boot || got.count != before.count+1 || got.value != before.value {
		t.Errorf("%s: server state %+v, want boot %s count %d value %s (memory intact)", point, got, before.boot, before.count+1, before.value)
	}
	return true, got
}

// TestPauseRunnerKilled kills a `sandboxd runner` process (SIGKILL at each failpoint of
// the local backend's pause, resume and fork) and starts it again: the sandbox is PAUSED
// with a usable checkpoint, or RUNNING with its memory intact, or ended with a reason —
// never PAUSED without a checkpoint; a fork cut short is ended with a reason or absent,
// or complete; no fork image is left; after everything is deleted nothing is left
// (mounts, netns, sandbox and checkpoint dirs, cgroups).
func TestPauseRunnerKilled(t *testing.T) {
	needRunsc(t)
	if testing.Short() {
		t.Skip("restarts a runner process many times")
	}
	r := startCrashRig(t)
	ctx := context.Background()
	known := map[string]bool{}
	var src string
	var cur counterState
	// source is a running source sandbox with a known server state.
	source := func(t *testing.T) {
		t.Helper()
		if src != "" {
			return
		}
		sb := r.g.createRetrying(t, counterSpec2())
		src = sb.SandboxId
		known[src] = true
		r.g.waitState(t, src, sandboxv1.State_STATE_RUNNING)
		if _, err := r.exec(src, "echo v"+src[:4]+" > /tmp/v"); err != nil {
			t.Fatal(err)
		}
		var err error
		if cur, err = r.counter(t, src); err != nil {
			t.Fatal(err)
		}
		if len(processesUsing(r.dataDir)) == 0 {
			t.Error("no process names the data dir while a sandbox runs: the process leak check sees nothing")
		}
	}
	after := func(t *testing.T, point string) {
		t.Helper()
		ok, st := r.check(t, point, src, cur)
		if !ok {
			src = ""
			return
		}
		cur = st
		if imgs, _ := filepath.Glob(filepath.Join(r.dataDir, "sandboxes", src, "fork-*")); len(imgs) > 0 {
			t.Errorf("%s: fork images left in the source's dir: %q", point, imgs)
		}
	}
	pause := func(ctx context.Context) error {
		_, err := r.state.PauseSandbox(ctx, connect.NewRequest(&statev1.PauseSandboxRequest{SandboxId: src}))
		return err
	}

	for _, point := range []string{"local.pause.tmp", "local.pause.suspended", "local.pause.paused", "local.pause.saved",
		"local.pause.renamed", "local.pause.marked", "local.pause.ended"} {
		t.Run(point, func(t *testing.T) {
			source(t)
			r.restart(t, point)
			r.killedBy(t, point, pause, nil)
			after(t, point)
		})
	}

	for _, point := range []string{"local.resume.marked", "local.resume.removed", "local.resume.restored", "local.resume.agent"} {
		t.Run(point, func(t *testing.T) {
			source(t)
			if err := pause(ctx); err != nil {
				t.Fatalf("pause: %v", err)
			}
			r.restart(t, point)
			r.killedBy(t, point, func(ctx context.Context) error {
				_, err := r.state.ResumeSandbox(ctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: src}))
				return err
			}, nil)
			after(t, point)
		})
	}

	// Fork: the source's image being saved, then each fork being made.
	for _, point := range []string{"local.pause.saved", "local.create.network", "local.create.started", "local.create.info"} {
		t.Run("fork "+point, func(t *testing.T) {
			source(t)
			r.restart(t, point)
			r.killedBy(t, point, func(ctx context.Context) error {
				_, err := r.state.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: src, Count: 3}))
				return err
			}, func() {
				// The premise: the crash cut a fork short (its image or a fork's dir is there).
				var made []string
				if point == "local.pause.saved" {
					made, _ = filepath.Glob(filepath.Join(r.dataDir, "sandboxes", src, "fork-*"))
				} else {
					ents, _ := os.ReadDir(filepath.Join(r.dataDir, "sandboxes"))
					for _, e := range ents {
						if !strings.HasPrefix(e.Name(), ".") && !known[e.Name()] {
							made = append(made, e.Name())
						}
					}
				}
				if len(made) == 0 {
					t.Errorf("%s: nothing of the fork on disk when the runner died (the test's premise)", point)
				}
			})
			after(t, "fork "+point)
			list, err := r.g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			forks := 0
			for _, sb := range list.Msg.GetSandboxes() {
				id := sb.GetSandboxId()
				if known[id] {
					continue
				}
				known[id] = true
				forks++
				st := r.settled(t, id)
				if st == nil {
					continue
				}
				t.Logf("fork %s after the restart: %s %s", id, st.GetState(), st.GetStateReason())
				switch st.GetState() {
				case sandboxv1.State_STATE_RUNNING:
					// Complete before the crash: it must be whole.
					got, err := r.counter(t, id)
					if err != nil || got.boot != cur.boot {
						t.Errorf("RUNNING fork %s is not whole: %+v %v (source boot %s)", id, got, err, cur.boot)
					}
				case sandboxv1.State_STATE_FAILED, sandboxv1.State_STATE_TERMINATED, sandboxv1.State_STATE_COMPLETED:
					if st.GetStateReason() == "" {
						t.Errorf("fork %s %s without a reason", id, st.GetState())
					}
				default:
					t.Errorf("fork %s cut short is %s (%s): want ended with a reason, absent or whole", id, st.GetState(), st.GetStateReason())
				}
			}
			t.Logf("fork %s: %d forks listed after the crash", point, forks)
			// What the runner has that no gateway recorded (a fork made whole, never
			// reported) the reconciler deletes; then the runner has only known sandboxes.
			unknown := func() []string {
				sbs, err := r.rc.List(ctx)
				if err != nil {
					t.Fatalf("runner list: %v", err)
				}
				var out []string
				for _, sb := range sbs {
					if !known[sb.ID] && !sb.State.Terminal() {
						out = append(out, sb.ID+" "+sb.State.String())
					}
				}
				return out
			}
			if u := unknown(); len(u) > 0 {
				t.Logf("fork %s: sandboxes on the runner no gateway recorded: %q", point, u)
				// At most those: one may end on its own between the listing and the
				// reconcile (a fork cut short by the crash); that none is left running
				// unrecorded is what the wait below checks.
				if n := r.gwy.Reconcile(ctx); n > len(u) {
					t.Errorf("reconcile deleted %d sandboxes, want at most the %d unrecorded", n, len(u))
				}
				deadline := time.Now().Add(30 * time.Second)
				for len(unknown()) > 0 && time.Now().Before(deadline) {
					time.Sleep(100 * time.Millisecond)
				}
				if u := unknown(); len(u) > 0 {
					t.Errorf("after reconcile: %q", u)
				}
			}
		})
	}

	// Everything deleted, nothing left: the rig's cleanup checks the data dir, mounts
	// and cgroups once the runner has stopped.
	list, err := r.g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list.Msg.GetSandboxes() {
		if _, err := r.g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.SandboxId})); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("delete %s: %v", sb.SandboxId, err)
			continue
		}
	}
	for _, sb := range list.Msg.GetSandboxes() {
		st := r.settled(t, sb.SandboxId)
		for st != nil && st.GetState() != sandboxv1.State_STATE_TERMINATED && st.GetState() != sandboxv1.State_STATE_FAILED && st.GetState() != sandboxv1.State_STATE_COMPLETED {
			time.Sleep(100 * time.Millisecond)
			st = r.settled(t, sb.SandboxId)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, _ := os.ReadDir(filepath.Join(r.dataDir, "sandboxes"))
		var names []string
		for _, e := range left {
			if !strings.HasPrefix(e.Name(), ".") {
				names = append(names, e.Name())
			}
		}
		if len(names) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("sandbox dirs left after every sandbox was deleted: %q", names)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// counterSpec2 is counterSpec without the endpoint (the split rig runs no edge).
func counterSpec2() *sandboxv1.SandboxSpec {
	sp := counterSpec()
	sp.Services = nil
	return sp
}

// processesUsing are the command lines of the processes naming dir in theirs.
func processesUsing(dir string) []string {
	var out []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range cmdlines {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		if cl := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(cl, dir+"/") {
			out = append(out, cl)
		}
	}
	return out
}
