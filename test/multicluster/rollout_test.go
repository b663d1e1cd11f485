package multicluster

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/testbed"
	"github.com/sandboxd/sandboxd/internal/testenv"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// TestAutomaticRollout is issue 18's scenario on the multi-runner bed: three single-host
// runners on two channels, every release a signed manifest (the control plane and the
// runners trust the key) whose binaries the control plane serves.
//   - v0.0.2 published to RAPID: only the two RAPID runners update, by themselves (no
//     ApplyAvailableUpdate), one at a time; their sandboxes keep running and answer exec.
//   - promoted to STABLE: the STABLE runner does not move while outside its maintenance
//     window, and moves once its window is open.
//   - v0.0.3, whose runner never comes up (its agent is not an executable), published to
//     RAPID: the first RAPID runner tries it, falls back to v0.0.2 by itself, the control
//     plane rolls it back and halts RAPID's rollout with the reason in ListReleases and in
//     the runner's status, and the other RAPID runner never starts.
func TestAutomaticRollout(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, runc")
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	work := t.TempDir()
	arch := runtime.GOARCH
	builds := filepath.Join(work, "builds")
	v1, v2, v3 := buildVersion(t, builds, "v0.0.1"), buildVersion(t, builds, "v0.0.2"), buildVersion(t, builds, "v0.0.3")
	agent := filepath.Join(bin, "sandbox-agent")
	// v0.0.3's agent is a script: the runner's local backend refuses it at start-up.
	badAgent := filepath.Join(builds, "bad-agent")
	if err := os.WriteFile(badAgent, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	// The operator's signing key; the control plane and every runner trust its public half.
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(work, "release-keys.pub")
	if err := os.WriteFile(keys, release.MarshalPublicKey(pub), 0o644); err != nil {
		t.Fatal(err)
	}
	releases := filepath.Join(work, "releases")
	// stage puts a version's binaries in the release dir and returns its signed manifest.
	stage := func(version, sandboxd, agentFile string) (manifest, sig []byte) {
		copyFile(t, sandboxd, filepath.Join(releases, version, arch, "sandboxd"))
		copyFile(t, agentFile, filepath.Join(releases, version, arch, "sandbox-agent"))
		digest := "sha256:" + strings.Repeat("0", 64)
		m, err := json.Marshal(release.Manifest{Version: version, RunnerImageDigest: digest, AgentImageDigest: digest,
			Binaries: map[string]release.Binaries{arch: {Sandboxd: fileSum(t, sandboxd), Agent: fileSum(t, agentFile)}}})
		if err != nil {
			t.Fatal(err)
		}
		return m, release.Sign(priv, m)
	}

	// Each runner has its own install of v0.0.1, which it replaces when it updates.
	runners := []testbed.Runner{
		{ID: "rapid-a", Channel: controlplanev1.ReleaseChannel_RAPID},
		{ID: "rapid-b", Channel: controlplanev1.ReleaseChannel_RAPID},
		{ID: "stable", Channel: controlplanev1.ReleaseChannel_STABLE},
	}
	for i := range runners {
		runners[i].Bin = filepath.Join(work, "bin-"+runners[i].ID)
		copyFile(t, v1, filepath.Join(runners[i].Bin, "sandboxd"))
		copyFile(t, agent, filepath.Join(runners[i].Bin, "sandbox-agent"))
		runners[i].Args = []string{"--release-keys", keys}
	}
	if err := os.MkdirAll(releases, 0o755); err != nil {
		t.Fatal(err)
	}
	dsn := newDatabase(t)
	const deadline = 90 * time.Second
	b, err := testbed.Start(ctx, testbed.Config{Dir: filepath.Join(work, "bed"), Bin: bin, DSN: dsn, Gateways: 1, Runners: runners,
		ControlPlaneArgs: []string{"--release-dir", releases, "--release-keys", keys,
			"--rollout-tick", "250ms", "--rollout-batch", "1", "--rollout-deadline", deadline.String()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, l := range b.Close() {
			t.Errorf("left behind: %s", l)
		}
		if t.Failed() {
			for _, p := range append([]*testbed.Proc{b.CP}, b.Runners...) {
				if log, err := os.ReadFile(p.Log()); err == nil {
					t.Logf("---- %s\n%s", p.Name, tail(log, 6000))
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
	status := func(id string) *controlplanev1.ManagedRunner {
		t.Helper()
		r, err := admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return r.Msg
	}
	waitFor := func(what string, timeout time.Duration, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(timeout); !ok(); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not after %s", what, timeout)
			}
		}
	}
	reports := func(id, version string) func() bool {
		return func() bool {
			st := status(id).GetStatus()
			return st.GetVersion() == version && st.GetConnection() == controlplanev1.ConnectionStatus_CONNECTED
		}
	}
	publish := func(version string, manifest, sig []byte) {
		t.Helper()
		if _, err := rel.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Manifest: manifest, Signature: sig})); err != nil {
			t.Fatalf("publish %s: %v", version, err)
		}
	}
	promote := func(version string) {
		t.Helper()
		if _, err := rel.PromoteRelease(ctx, connect.NewRequest(&controlplanev1.PromoteReleaseRequest{Version: version})); err != nil {
			t.Fatalf("promote %s: %v", version, err)
		}
	}
	setWindow := func(id, cron string, dur time.Duration) {
		t.Helper()
		if _, err := admin.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
			ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: id, MaintenancePolicy: &controlplanev1.MaintenancePolicy{
				Windows: []*controlplanev1.MaintenanceWindow{{Cron: cron, DurationSeconds: int64(dur / time.Second)}}}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"maintenance_policy"}}})); err != nil {
			t.Fatalf("maintenance policy of %s: %v", id, err)
		}
	}
	for _, r := range runners {
		waitFor(r.ID+" on v0.0.1, updating itself", time.Minute, func() bool {
			st := status(r.ID).GetStatus()
			return st.GetVersion() == "v0.0.1" && st.GetSelfUpdate()
		})
	}
	// STABLE's window opens at a time two hours off: outside it now.
	off := time.Now().UTC().Add(2 * time.Hour)
	setWindow("stable", fmt.Sprintf("%d %d * * *", off.Minute(), off.Hour()), time.Hour)

	// v0.0.1 is what both channels offer first: nothing moves.
	m, sig := stage("v0.0.1", v1, agent)
	publish("v0.0.1", m, sig)
	promote("v0.0.1")

	// A sandbox on each runner, with a process that must live through its updates, and
	// execs into all of them the whole time.
	sdk, err := sandbox.New(b.GatewayURL(0), b.UserKey)
	if err != nil {
		t.Fatal(err)
	}
	type box struct {
		sb      *sandbox.Sandbox
		sleeper string
	}
	boxes := map[string]*box{}
	run := func(sb *sandbox.Sandbox, cmd string) (string, error) {
		var last error
		for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
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
	for _, r := range runners {
		sb, err := sdk.Create(ctx, sandbox.Spec{Image: "busybox", CPU: "100m", Memory: "64Mi", RunnerIDs: []string{r.ID},
			Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & echo $! > /tmp/sleeper; wait`}})
		if err != nil {
			t.Fatalf("sandbox on %s: %v", r.ID, err)
		}
		t.Cleanup(func() { _ = sdk.Delete(context.Background(), sb.ID()) })
		bx := &box{sb: sb}
		waitFor("the sleeper on "+r.ID, 30*time.Second, func() bool {
			out, err := run(sb, "cat /tmp/sleeper")
			bx.sleeper = strings.TrimSpace(out)
			return err == nil && bx.sleeper != ""
		})
		boxes[r.ID] = bx
	}
	alive := func(id, when string) {
		t.Helper()
		if out, err := run(boxes[id].sb, "kill -0 "+boxes[id].sleeper+" && echo alive"); err != nil || strings.TrimSpace(out) != "alive" {
			t.Fatalf("%s: the sandbox on %s lost its process: %q %v", when, id, out, err)
		}
	}
	// Execs go into every sandbox all along, one attempt each (no retries): the longest
	// gap between two answered execs of a sandbox is how long it could not be reached
	// while its runner re-executed.
	var execs, unanswered atomic.Int64
	var gapMu sync.Mutex
	var maxGap time.Duration
	var lastErr atomic.Value
	stopExecs := make(chan struct{})
	var wg sync.WaitGroup
	for id, bx := range boxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := time.Now()
			for {
				select {
				case <-stopExecs:
					gapMu.Lock()
					maxGap = max(maxGap, time.Since(last))
					gapMu.Unlock()
					return
				case <-time.After(200 * time.Millisecond):
				}
				actx, acancel := context.WithTimeout(ctx, 15*time.Second)
				out, _, code, err := bx.sb.Run(actx, []string{"/bin/sh", "-c", "echo ok"})
				acancel()
				if err != nil || code != 0 || string(out) != "ok\n" {
					unanswered.Add(1)
					lastErr.Store(fmt.Sprintf("%s: code %d %q %v", id, code, out, err))
					continue
				}
				execs.Add(1)
				gapMu.Lock()
				maxGap = max(maxGap, time.Since(last))
				gapMu.Unlock()
				last = time.Now()
			}
		}()
	}
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopExecs) }); wg.Wait() }
	defer stop()

	// A watcher records how many runners update at once and whether STABLE ever moves
	// before its window opens.
	var maxInFlight atomic.Int64
	var stableMoved atomic.Bool
	var watchStable atomic.Bool
	watchStable.Store(true)
	watchDone := make(chan struct{})
	stopWatch := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(100 * time.Millisecond):
			}
			res, err := admin.ListManagedRunners(ctx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
			if err != nil {
				continue
			}
			var n int64
			for _, r := range res.Msg.GetManagedRunners() {
				st := r.GetStatus()
				if st.GetDesiredVersion() != "" || st.GetRolloutInProgress() {
					n++
				}
				if r.GetRunnerId() == "stable" && watchStable.Load() && (st.GetDesiredVersion() != "" || st.GetVersion() != "v0.0.1") {
					stableMoved.Store(true)
				}
			}
			if n > maxInFlight.Load() {
				maxInFlight.Store(n)
			}
		}
	}()
	defer func() {
		select {
		case <-stopWatch:
		default:
			close(stopWatch)
		}
		<-watchDone
	}()

	// The floor an update is measured against: the same runner killed and started again by
	// hand, until the control plane has its next heartbeat (re-adopting its sandbox).
	var floor time.Duration
	t.Run("restart by hand (the floor)", func(t *testing.T) {
		p := b.Runners[0]
		t0 := time.Now()
		p.Kill()
		if err := p.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor("a heartbeat after the restart", time.Minute, func() bool {
			return status(p.Name[len("runner-"):]).GetStatus().GetLastHeartbeatTime().AsTime().After(t0.Add(500 * time.Millisecond))
		})
		floor = time.Since(t0)
		alive(runners[0].ID, "after a restart by hand")
	})
	stepTime := func(id string) time.Duration {
		lu := status(id).GetStatus().GetLastUpdateResult()
		return lu.GetEndTime().AsTime().Sub(lu.GetStartTime().AsTime())
	}

	t.Run("RAPID moves, one at a time", func(t *testing.T) {
		m, sig := stage("v0.0.2", v2, agent)
		publish("v0.0.2", m, sig)
		for _, id := range []string{"rapid-a", "rapid-b"} {
			waitFor(id+" on v0.0.2", 4*time.Minute, reports(id, "v0.0.2"))
		}
		for _, id := range []string{"rapid-a", "rapid-b"} {
			waitFor(id+"'s step succeeded", deadline, func() bool {
				st := status(id).GetStatus()
				lu := st.GetLastUpdateResult()
				return lu.GetState() == controlplanev1.UpdateState_UPDATE_STATE_SUCCEEDED && lu.GetToVersion() == "v0.0.2" &&
					st.GetDesiredVersion() == "" && !st.GetRolloutInProgress()
			})
			alive(id, "after its update")
		}
		for _, id := range []string{"rapid-a", "rapid-b"} {
			d := stepTime(id)
			t.Logf("%s: update step (set desired → download, verify, swap, re-exec → ready heartbeat) %s; restart by hand %s; ratio %.2f",
				id, d.Round(time.Millisecond), floor.Round(time.Millisecond), float64(d)/float64(floor))
		}
		if n := maxInFlight.Load(); n != 1 {
			t.Fatalf("at most %d runners were updating at once, want exactly 1", n)
		}
		if stableMoved.Load() {
			t.Fatal("the STABLE runner moved while STABLE offered v0.0.1")
		}
	})

	t.Run("STABLE waits for its window", func(t *testing.T) {
		promote("v0.0.2")
		time.Sleep(5 * time.Second) // twenty ticks
		if stableMoved.Load() {
			t.Fatal("the STABLE runner moved outside its maintenance window")
		}
		if st := status("stable").GetStatus(); st.GetVersion() != "v0.0.1" || st.GetDesiredVersion() != "" || !st.GetUpdateAvailable() {
			t.Fatalf("stable outside its window: %v", st)
		}
		watchStable.Store(false)
		setWindow("stable", "* * * * *", 2*time.Minute) // open now
		waitFor("stable on v0.0.2", 4*time.Minute, reports("stable", "v0.0.2"))
		waitFor("stable's step succeeded", deadline, func() bool {
			return status("stable").GetStatus().GetLastUpdateResult().GetState() == controlplanev1.UpdateState_UPDATE_STATE_SUCCEEDED
		})
		alive("stable", "after its update")
	})

	t.Run("a version that never comes up is rolled back and halts RAPID", func(t *testing.T) {
		m, sig := stage("v0.0.3", v3, badAgent)
		publish("v0.0.3", m, sig)
		var first, other string
		waitFor("a RAPID runner tries v0.0.3", time.Minute, func() bool {
			for _, id := range []string{"rapid-a", "rapid-b"} {
				if lu := status(id).GetStatus().GetLastUpdateResult(); lu.GetToVersion() == "v0.0.3" {
					first = id
					return true
				}
			}
			return false
		})
		other = map[string]string{"rapid-a": "rapid-b", "rapid-b": "rapid-a"}[first]
		var halt *controlplanev1.ChannelRollout
		waitFor("RAPID's rollout halted", deadline+time.Minute, func() bool {
			res, err := rel.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
			if err != nil {
				return false
			}
			for _, r := range res.Msg.GetRollouts() {
				if r.GetChannel() == controlplanev1.ReleaseChannel_RAPID && r.GetState() == controlplanev1.RolloutState_ROLLOUT_STATE_HALTED {
					halt = r
					return true
				}
			}
			return false
		})
		// The runner says why (its v0.0.3 did not start: the agent), and the control plane
		// acts on that report at once rather than at the health gate's deadline.
		if halt.GetTargetVersion() != "v0.0.3" || !strings.Contains(halt.GetHaltReason(), "reports") ||
			!strings.Contains(halt.GetHaltReason(), "agent binary") || !strings.Contains(halt.GetHaltedByRunner(), first) {
			t.Fatalf("RAPID's halt: %v", halt)
		}
		if took := time.Since(halt.GetHaltTime().AsTime()); halt.GetHaltTime().AsTime().Sub(status(first).GetStatus().GetLastUpdateResult().GetStartTime().AsTime()) >= deadline {
			t.Fatalf("halted only at the deadline (%s ago)", took)
		}
		st := status(first).GetStatus()
		if lu := st.GetLastUpdateResult(); lu.GetState() != controlplanev1.UpdateState_UPDATE_STATE_ROLLED_BACK || lu.GetReason() == "" {
			t.Fatalf("%s's last update: %v", first, lu)
		}
		if st.GetRolloutHaltReason() == "" {
			t.Fatalf("%s's status does not show the halt: %v", first, st)
		}
		waitFor(first+" back on v0.0.2", time.Minute, reports(first, "v0.0.2"))
		// The runner fell back by itself: v0.0.2's binaries are in place again.
		if fileSum(t, filepath.Join(work, "bin-"+first, "sandboxd")) != fileSum(t, v2) ||
			fileSum(t, filepath.Join(work, "bin-"+first, "sandbox-agent")) != fileSum(t, agent) {
			t.Fatalf("%s's binaries are not v0.0.2's after the rollback", first)
		}
		time.Sleep(3 * time.Second)
		ost := status(other).GetStatus()
		if ost.GetVersion() != "v0.0.2" || ost.GetDesiredVersion() != "" || ost.GetLastUpdateResult().GetToVersion() == "v0.0.3" {
			t.Fatalf("%s started on v0.0.3 although the rollout halted: %v", other, ost)
		}
		alive(first, "after the rollback")
		alive(other, "after the halt")
		t.Logf("RAPID halted: %s", halt.GetHaltReason())
	})

	stop()
	for _, p := range b.Runners {
		if !p.Running() {
			t.Errorf("%s exited: a runner re-executes in place", p.Name)
		}
		// Each runner checked the signed manifest itself (it trusts the key), not only
		// the checksums the control plane relayed.
		if log, err := os.ReadFile(p.Log()); err != nil || !strings.Contains(string(log), "release manifest signature verified") {
			t.Errorf("%s: no verified release manifest in its log (%v)", p.Name, err)
		}
	}
	// Every sandbox answered exec until the end, and never went a minute without
	// answering (a runner's re-execution takes seconds).
	if execs.Load() == 0 || maxGap >= time.Minute {
		t.Fatalf("execs during the rollout: %d answered, %d not; longest gap %s (last error: %v)", execs.Load(), unanswered.Load(), maxGap, lastErr.Load())
	}
	t.Logf("%d execs answered in the three sandboxes during the rollout, %d not (while their runner re-executed); longest gap between answers %s; at most %d runner(s) updating at once",
		execs.Load(), unanswered.Load(), maxGap.Round(time.Millisecond), maxInFlight.Load())
}
