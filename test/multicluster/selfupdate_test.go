package multicluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/testbed"
	"github.com/sandboxd/sandboxd/internal/testenv"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// buildVersion builds sandboxd as version v into dir (as testbed.Build does, with the
// version linked in: how a release's binary differs from the last).
func buildVersion(t *testing.T, dir, v string) string {
	t.Helper()
	out := filepath.Join(dir, "sandboxd-"+v)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-X github.com/sandboxd/sandboxd/internal/version.version="+v,
		"-o", out, "github.com/sandboxd/sandboxd/cmd/sandboxd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", v, err, b)
	}
	return out
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestRunnerSelfUpdate: a single-host runner with a running sandbox is told to update;
// it downloads the release from the control plane, swaps its binary, re-executes in
// place (the process never exits) and heartbeats the new version, while the sandbox
// keeps running and answers exec throughout. Then releases it must not install: one
// whose sandboxd does not run, one whose checksum does not match (both refused before
// anything is replaced), and one that runs but cannot reach the control plane before
// the trial's deadline (rolled back to the previous binary, re-executed).
func TestRunnerSelfUpdate(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, runc")
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	work := t.TempDir()
	builds := filepath.Join(work, "builds")
	v1 := buildVersion(t, builds, "v0.0.1")
	v2 := buildVersion(t, builds, "v0.0.2")
	v5 := buildVersion(t, builds, "v0.0.5")
	// The runner's own install: v0.0.1 and the agent, apart from the other processes'.
	runnerBin := filepath.Join(work, "runner-bin")
	copyFile(t, v1, filepath.Join(runnerBin, "sandboxd"))
	copyFile(t, filepath.Join(bin, "sandbox-agent"), filepath.Join(runnerBin, "sandbox-agent"))
	agentSum := fileSum(t, filepath.Join(runnerBin, "sandbox-agent"))
	releases := filepath.Join(work, "releases")
	arch := runtime.GOARCH
	place := func(version, file string) {
		copyFile(t, file, filepath.Join(releases, version, arch, "sandboxd"))
	}

	// A bed of one runner on its own database.
	dsn := newDatabase(t)
	if err := os.MkdirAll(releases, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := testbed.Start(ctx, testbed.Config{Dir: filepath.Join(work, "bed"), Bin: bin, RunnerBin: runnerBin, DSN: dsn, Gateways: 1,
		Runners:          []testbed.Runner{{ID: "single", Args: []string{"--self-update-deadline", "15s"}}},
		ControlPlaneArgs: []string{"--release-dir", releases}})
	if err != nil {
		t.Fatal(err)
	}
	runnerProc := b.Runners[0]
	t.Cleanup(func() {
		for _, l := range b.Close() {
			t.Errorf("left behind: %s", l)
		}
		if t.Failed() {
			for _, p := range []*testbed.Proc{b.CP, runnerProc} {
				if log, err := os.ReadFile(p.Log()); err == nil {
					t.Logf("---- %s\n%s", p.Name, tail(log, 12000))
				}
			}
		}
	})
	rel, err := b.Releases()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := b.RunnerAdmin()
	if err != nil {
		t.Fatal(err)
	}
	runnerLog := func() string { s, _ := os.ReadFile(runnerProc.Log()); return string(s) }
	waitLog := func(what string, since int, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for !strings.Contains(runnerLog()[since:], what) {
			if time.Now().After(deadline) {
				t.Fatalf("runner log: no %q after %s", what, timeout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	reported := func() string {
		r, err := admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "single"}))
		if err != nil {
			return "error: " + err.Error()
		}
		return r.Msg.GetStatus().GetVersion()
	}
	waitVersion := func(want string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for got := reported(); got != want; got = reported() {
			if time.Now().After(deadline) {
				t.Fatalf("runner reports version %q, want %q after %s", got, want, timeout)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	publish := func(version, sandboxdSum string) {
		t.Helper()
		digest := "sha256:" + strings.Repeat("0", 64)
		if _, err := rel.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: &controlplanev1.Release{
			Version: version, RunnerImageDigest: digest, AgentImageDigest: digest, BinaryChecksums: map[string]string{arch: sandboxdSum}}})); err != nil {
			t.Fatalf("publish %s: %v", version, err)
		}
		if _, err := rel.PromoteRelease(ctx, connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: version})); err != nil {
			t.Fatalf("promote %s: %v", version, err)
		}
		if _, err := admin.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "single"})); err != nil {
			t.Fatalf("apply %s: %v", version, err)
		}
	}
	waitVersion("v0.0.1", 30*time.Second)

	// A sandbox with a process that must live through every restart.
	sdk, err := sandbox.New(b.GatewayURL(0), b.UserKey)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := sdk.Create(ctx, sandbox.Spec{Image: "busybox", CPU: "100m", Memory: "64Mi",
		Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & echo $! > /tmp/sleeper; wait`}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdk.Delete(context.Background(), sb.ID()) })
	// exec runs a command, retrying while the runner restarts (UNAVAILABLE for a moment).
	run := func(cmd string) (string, error) {
		var last error
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			actx, acancel := context.WithTimeout(ctx, 15*time.Second)
			out, errs, code, err := sb.Run(actx, []string{"/bin/sh", "-c", cmd})
			acancel()
			if err == nil && code == 0 {
				return string(out), nil
			}
			last = fmt.Errorf("code %d err %w stderr %q", code, err, errs)
		}
		return "", last
	}
	var sleeper string
	for deadline := time.Now().Add(30 * time.Second); sleeper == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := run("cat /tmp/sleeper")
		if err != nil {
			t.Fatalf("exec before the update: %v", err)
		}
		sleeper = strings.TrimSpace(out)
	}
	alive := func(when string) {
		t.Helper()
		if out, err := run("kill -0 " + sleeper + " && echo alive"); err != nil || strings.TrimSpace(out) != "alive" {
			t.Fatalf("%s: the sandbox's process %s: %q %v", when, sleeper, out, err)
		}
	}
	alive("before the update")

	// Execs keep going all along; each must succeed (retrying through the restart).
	var execs, execFails atomic.Int64
	var execErr atomic.Value
	stopExecs := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopExecs) }); wg.Wait() }
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stopExecs:
				return
			case <-time.After(300 * time.Millisecond):
			}
			if out, err := run("echo ok"); err != nil || out != "ok\n" {
				execFails.Add(1)
				execErr.Store(fmt.Sprintf("%q %v", out, err))
			}
			execs.Add(1)
		}
	}()
	defer stop()

	t.Run("update", func(t *testing.T) {
		mark := len(runnerLog())
		place("v0.0.2", v2)
		publish("v0.0.2", fileSum(t, v2))
		waitVersion("v0.0.2", 2*time.Minute)
		waitLog("new version confirmed", mark, 30*time.Second)
		logs := runnerLog()[mark:]
		for _, step := range []string{"runner update: downloading", "checksum verified", "binaries verified; swapping them in",
			"binaries in place", "re-executing", "runner update: new version on trial", "new version confirmed"} {
			if !strings.Contains(logs, step) {
				t.Errorf("runner log has no %q", step)
			}
		}
		if strings.Contains(logs, "==== ") || !runnerProc.Running() {
			t.Fatal("the runner process exited: it must re-execute in place")
		}
		if got := fileSum(t, filepath.Join(runnerBin, "sandboxd")); got != fileSum(t, v2) {
			t.Fatal("sandboxd is not the new version's")
		}
		if got := fileSum(t, filepath.Join(runnerBin, "sandboxd.prev")); got != fileSum(t, v1) {
			t.Fatal("sandboxd.prev is not the previous version's")
		}
		if fileSum(t, filepath.Join(runnerBin, "sandbox-agent")) != agentSum {
			t.Fatal("the agent changed, but the release has none")
		}
		alive("after the update")
	})

	t.Run("broken release refused", func(t *testing.T) {
		mark := len(runnerLog())
		broken := filepath.Join(work, "broken")
		if err := os.WriteFile(broken, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		place("v0.0.3", broken)
		publish("v0.0.3", fileSum(t, broken))
		waitLog("runner update refused", mark, time.Minute)
		if logs := runnerLog()[mark:]; !strings.Contains(logs, "the new sandboxd does not run") || strings.Contains(logs, "swapping them in") {
			t.Fatalf("runner log:\n%s", logs)
		}
		if fileSum(t, filepath.Join(runnerBin, "sandboxd")) != fileSum(t, v2) || reported() != "v0.0.2" {
			t.Fatal("the runner left v0.0.2")
		}
	})

	t.Run("checksum mismatch refused", func(t *testing.T) {
		mark := len(runnerLog())
		place("v0.0.4", v5) // a real sandboxd, but not the one the record names
		publish("v0.0.4", strings.Repeat("ab", 32))
		waitLog("runner update refused", mark, time.Minute)
		if logs := runnerLog()[mark:]; !strings.Contains(logs, "has SHA-256") || strings.Contains(logs, "swapping them in") {
			t.Fatalf("runner log:\n%s", logs)
		}
		if fileSum(t, filepath.Join(runnerBin, "sandboxd")) != fileSum(t, v2) || reported() != "v0.0.2" {
			t.Fatal("the runner left v0.0.2")
		}
		// Not retried while the control plane asks for it.
		time.Sleep(3 * time.Second)
		if n := strings.Count(runnerLog()[mark:], "runner update: downloading"); n != 1 {
			t.Fatalf("v0.0.4 downloaded %d times, want once", n)
		}
	})

	t.Run("no heartbeat before the deadline rolls back", func(t *testing.T) {
		mark := len(runnerLog())
		place("v0.0.5", v5)
		publish("v0.0.5", fileSum(t, v5))
		// Once the new binary is in place, the control plane goes away: v0.0.5 starts
		// but no heartbeat goes through before its deadline.
		waitLog("binaries in place", mark, time.Minute)
		b.CP.Stop()
		waitLog("runner update: new version on trial", mark, time.Minute)
		waitLog("the new version did not come up; rolling back", mark, time.Minute)
		waitLog("runner update: back on the previous version", mark, time.Minute)
		if err := b.CP.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		waitVersion("v0.0.2", time.Minute)
		if fileSum(t, filepath.Join(runnerBin, "sandboxd")) != fileSum(t, v2) {
			t.Fatal("sandboxd is not v0.0.2's after the rollback")
		}
		if logs := runnerLog()[mark:]; strings.Contains(logs, "==== ") || !runnerProc.Running() {
			t.Fatal("the runner process exited: it must re-execute in place")
		}
		// v0.0.5 is not tried again while the control plane asks for it.
		time.Sleep(3 * time.Second)
		if n := strings.Count(runnerLog()[mark:], "runner update: downloading"); n != 1 {
			t.Fatalf("v0.0.5 downloaded %d times, want once", n)
		}
		alive("after the rollback")
	})

	stop()
	if execs.Load() == 0 || execFails.Load() > 0 {
		t.Fatalf("execs during the updates: %d, %d failed (last: %v)", execs.Load(), execFails.Load(), execErr.Load())
	}
	t.Logf("%d execs during the updates, none failed", execs.Load())
}
