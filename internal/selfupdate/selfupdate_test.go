package selfupdate

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/release"
)

type tree struct {
	data, bin string
	bins      Binaries
}

func newTree(t *testing.T) tree {
	t.Helper()
	tr := tree{data: t.TempDir(), bin: t.TempDir()}
	tr.bins = Binaries{Sandboxd: filepath.Join(tr.bin, "sandboxd"), Agent: filepath.Join(tr.bin, "sandbox-agent")}
	write(t, tr.bins.Sandboxd, "old sandboxd")
	write(t, tr.bins.Agent, "old agent")
	return tr
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func (tr tree) swap(t *testing.T, agent bool) {
	t.Helper()
	sd := filepath.Join(tr.bin, ".staged-sandboxd")
	write(t, sd, "new sandboxd")
	ag := ""
	if agent {
		ag = filepath.Join(tr.bin, ".staged-agent")
		write(t, ag, "new agent")
	}
	if err := Swap(tr.data, tr.bins, sd, ag, Trial{From: "v1.0.0", To: "v2.0.0"}); err != nil {
		t.Fatal(err)
	}
}

// TestSwapCrashRollsBack: after a swap the new binaries are in place and the old kept as
// *.prev; the first start of the new version is its trial; a second start with the trial
// still pending (it crashed, a supervisor restarted it) restores the old binaries; the
// old version's start then clears the trial and remembers the failed version.
func TestSwapCrashRollsBack(t *testing.T) {
	tr := newTree(t)
	tr.swap(t, true)
	if read(t, tr.bins.Sandboxd) != "new sandboxd" || read(t, tr.bins.Agent) != "new agent" ||
		read(t, prev(tr.bins.Sandboxd)) != "old sandboxd" || read(t, prev(tr.bins.Agent)) != "old agent" {
		t.Fatal("swap did not put the new binaries in place and keep the old")
	}
	d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet())
	if err != nil || d != Trying {
		t.Fatalf("first start of the new version: %v %v, want Trying", d, err)
	}
	d, err = Startup(tr.data, tr.bins, "v2.0.0", quiet())
	if err != nil || d != RolledBack {
		t.Fatalf("second start with the trial pending: %v %v, want RolledBack", d, err)
	}
	if read(t, tr.bins.Sandboxd) != "old sandboxd" || read(t, tr.bins.Agent) != "old agent" {
		t.Fatal("rollback did not restore the old binaries")
	}
	d, err = Startup(tr.data, tr.bins, "v1.0.0", quiet())
	st, _ := LoadState(tr.data)
	if err != nil || d != Run || st.Trial != nil || st.Failed != "v2.0.0" || !strings.Contains(st.FailedReason, "without confirming") {
		t.Fatalf("old version's start: %v %v, state %+v", d, err, st)
	}
	// And an Updater on it does not try v2.0.0 again.
	fetches := 0
	u, err := New(Config{DataDir: tr.data, Bins: tr.bins, Running: "v1.0.0", Arch: "amd64", Logger: quiet(), Restart: func(string) {},
		Fetch: func(context.Context, string, string, string, io.Writer, int64) error { fetches++; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := u.Apply(t.Context(), Offer{Version: "v2.0.0", SandboxdSHA256: strings.Repeat("a", 64)}); ok || err != nil || fetches != 0 {
		t.Fatalf("failed version retried: %v %v, %d fetches", ok, err, fetches)
	}
}

// TestConfirmEndsTrial: a confirmed version is not rolled back on its next start.
func TestConfirmEndsTrial(t *testing.T) {
	tr := newTree(t)
	tr.swap(t, false)
	if d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != Trying || err != nil {
		t.Fatal(d, err)
	}
	if err := Confirm(tr.data, "v2.0.0"); err != nil {
		t.Fatal(err)
	}
	if d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != Run || err != nil {
		t.Fatalf("start after confirm: %v %v", d, err)
	}
	if read(t, tr.bins.Sandboxd) != "new sandboxd" || read(t, tr.bins.Agent) != "old agent" {
		t.Fatal("confirmed binaries changed")
	}
}

// TestWatchTrialDeadline: a new version that is not healthy by the deadline restores the
// previous binaries and restarts; a healthy one is confirmed.
func TestWatchTrialDeadline(t *testing.T) {
	tr := newTree(t)
	tr.swap(t, true)
	if _, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); err != nil {
		t.Fatal(err)
	}
	var reason string
	WatchTrial(t.Context(), tr.data, tr.bins, "v2.0.0", 300*time.Millisecond, func() bool { return false }, func(r string) { reason = r }, quiet())
	if reason == "" || read(t, tr.bins.Sandboxd) != "old sandboxd" || read(t, tr.bins.Agent) != "old agent" {
		t.Fatalf("no rollback at the deadline (restart %q)", reason)
	}
	st, _ := LoadState(tr.data)
	if st.Failed != "v2.0.0" || !strings.Contains(st.FailedReason, "within 300ms") {
		t.Fatalf("state %+v", st)
	}

	tr = newTree(t)
	tr.swap(t, false)
	reason = ""
	WatchTrial(t.Context(), tr.data, tr.bins, "v2.0.0", time.Minute, func() bool { return true }, func(r string) { reason = r }, quiet())
	st, _ = LoadState(tr.data)
	if reason != "" || st.Trial != nil || read(t, tr.bins.Sandboxd) != "new sandboxd" {
		t.Fatalf("healthy version not confirmed: restart %q, state %+v", reason, st)
	}
}

// release serves one version's binaries to an Updater.
type fakeRelease struct {
	version string
	files   map[string][]byte
	fetches int
	err     error
}

func (f *fakeRelease) fetch(_ context.Context, version, arch, name string, w io.Writer, max int64) error {
	f.fetches++
	if f.err != nil {
		return f.err
	}
	b, ok := f.files[name]
	if version != f.version || arch != "amd64" || !ok {
		return errors.New("not found")
	}
	_, err := w.Write(b)
	return err
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// script is a "sandboxd" that answers `version` as version does (or fails).
func script(version string, ok bool) []byte {
	if !ok {
		return []byte("#!/bin/sh\nexit 1\n")
	}
	return []byte("#!/bin/sh\necho 'sandboxd " + version + "'\n")
}

func newUpdater(t *testing.T, tr tree, rel *fakeRelease, restarts *[]string, mod func(*Config)) *Updater {
	t.Helper()
	cfg := Config{DataDir: tr.data, Bins: tr.bins, Running: "v1.0.0", Arch: "amd64", Fetch: rel.fetch, Logger: quiet(),
		Restart: func(r string) { *restarts = append(*restarts, r) }}
	if mod != nil {
		mod(&cfg)
	}
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// untouched fails unless the binaries are the old ones, without staged leftovers.
func (tr tree) untouched(t *testing.T) {
	t.Helper()
	if read(t, tr.bins.Sandboxd) != "old sandboxd" || read(t, tr.bins.Agent) != "old agent" {
		t.Fatal("the binaries were replaced")
	}
	ents, _ := os.ReadDir(tr.bin)
	if len(ents) != 2 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("leftovers beside the binaries: %v", names)
	}
}

func TestUpdaterInstalls(t *testing.T) {
	tr := newTree(t)
	sd, agent := script("v2.0.0", true), []byte("new agent")
	rel := &fakeRelease{version: "v2.0.0", files: map[string][]byte{"sandboxd": sd, "sandbox-agent": agent}}
	var restarts []string
	u := newUpdater(t, tr, rel, &restarts, nil)
	ok, err := u.Apply(t.Context(), Offer{Version: "v2.0.0", SandboxdSHA256: sum(sd), AgentSHA256: sum(agent)})
	if !ok || err != nil || len(restarts) != 1 {
		t.Fatalf("apply: %v %v, restarts %v", ok, err, restarts)
	}
	if read(t, tr.bins.Sandboxd) != string(sd) || read(t, tr.bins.Agent) != "new agent" || read(t, prev(tr.bins.Sandboxd)) != "old sandboxd" {
		t.Fatal("binaries not swapped")
	}
	if fi, _ := os.Stat(tr.bins.Sandboxd); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode())
	}
	st, _ := LoadState(tr.data)
	if st.Trial == nil || st.Trial.From != "v1.0.0" || st.Trial.To != "v2.0.0" || !st.Trial.Agent {
		t.Fatalf("trial %+v", st.Trial)
	}
	// The same or no version offered: nothing to do.
	for _, v := range []string{"", "v1.0.0"} {
		u2 := newUpdater(t, tr, rel, &restarts, nil)
		if ok, err := u2.Apply(t.Context(), Offer{Version: v}); ok || err != nil {
			t.Fatal(v, ok, err)
		}
	}
}

// TestUpdaterRefuses: a checksum mismatch, a binary that does not run, a release
// without a checksum for this arch: refused before anything is replaced, and not tried
// again until another version is offered. A download error is retried after a backoff.
func TestUpdaterRefuses(t *testing.T) {
	good := script("v2.0.0", true)
	for name, tc := range map[string]struct {
		files map[string][]byte
		offer Offer
		want  string
	}{
		"checksum mismatch": {map[string][]byte{"sandboxd": good}, Offer{Version: "v2.0.0", SandboxdSHA256: sum([]byte("other"))}, "SHA-256"},
		"agent mismatch": {map[string][]byte{"sandboxd": good, "sandbox-agent": []byte("a")},
			Offer{Version: "v2.0.0", SandboxdSHA256: sum(good), AgentSHA256: sum([]byte("b"))}, "sandbox-agent of v2.0.0 has SHA-256"},
		"does not run":     {map[string][]byte{"sandboxd": script("", false)}, Offer{Version: "v2.0.0", SandboxdSHA256: sum(script("", false))}, "does not run"},
		"another version":  {map[string][]byte{"sandboxd": script("v3.0.0", true)}, Offer{Version: "v2.0.0", SandboxdSHA256: sum(script("v3.0.0", true))}, "says"},
		"no checksum":      {map[string][]byte{"sandboxd": good}, Offer{Version: "v2.0.0"}, "no valid sandboxd checksum"},
		"not semver":       {map[string][]byte{"sandboxd": good}, Offer{Version: "../x", SandboxdSHA256: sum(good)}, "version"},
		"too large":        {map[string][]byte{"sandboxd": append(good, make([]byte, 2000)...)}, Offer{Version: "v2.0.0", SandboxdSHA256: sum(good)}, "larger than"},
		"no manifest seam": {map[string][]byte{"sandboxd": good}, Offer{Version: "v2.0.0", SandboxdSHA256: sum(good)}, "cannot fetch signed manifests"},
	} {
		t.Run(name, func(t *testing.T) {
			tr := newTree(t)
			rel := &fakeRelease{version: "v2.0.0", files: tc.files}
			var restarts []string
			u := newUpdater(t, tr, rel, &restarts, func(c *Config) {
				c.MaxBytes = 1000
				if name == "no manifest seam" {
					pub, _, _ := ed25519.GenerateKey(rand.Reader)
					c.Keys = []ed25519.PublicKey{pub}
				}
			})
			ok, err := u.Apply(t.Context(), tc.offer)
			if ok || !errors.Is(err, ErrVerify) || !strings.Contains(err.Error(), tc.want) || len(restarts) != 0 {
				t.Fatalf("apply: %v %v (want %q), restarts %v", ok, err, tc.want, restarts)
			}
			tr.untouched(t)
			n := rel.fetches
			if ok, err := u.Apply(t.Context(), tc.offer); ok || err != nil || rel.fetches != n {
				t.Fatalf("retried a refused version: %v %v", ok, err)
			}
			if st, _ := LoadState(tr.data); st.Failed != tc.offer.Version {
				t.Fatalf("failed version not recorded: %+v", st)
			}
			// The control plane stops asking for it: the failure is forgotten.
			_, _ = u.Apply(t.Context(), Offer{})
			if st, _ := LoadState(tr.data); st.Failed != "" {
				t.Fatalf("failure kept after another version was offered: %+v", st)
			}
		})
	}

	t.Run("download error backs off", func(t *testing.T) {
		tr := newTree(t)
		rel := &fakeRelease{version: "v2.0.0", err: errors.New("connection reset")}
		var restarts []string
		now := time.Now()
		u := newUpdater(t, tr, rel, &restarts, func(c *Config) { c.Now = func() time.Time { return now } })
		offer := Offer{Version: "v2.0.0", SandboxdSHA256: sum(good)}
		if ok, err := u.Apply(t.Context(), offer); ok || err == nil || errors.Is(err, ErrVerify) {
			t.Fatalf("apply: %v %v", ok, err)
		}
		tr.untouched(t)
		if _, _ = u.Apply(t.Context(), offer); rel.fetches != 1 {
			t.Fatalf("retried at once: %d fetches", rel.fetches)
		}
		now = now.Add(11 * time.Second)
		rel.err, rel.files = nil, map[string][]byte{"sandboxd": good}
		if ok, err := u.Apply(t.Context(), offer); !ok || err != nil || len(restarts) != 1 {
			t.Fatalf("retry after the backoff: %v %v", ok, err)
		}
	})
}

// TestUpdaterSignedManifest: with --release-keys the manifest must be signed by a trusted
// key, be for the offered version and list the checksums the downloads matched.
func TestUpdaterSignedManifest(t *testing.T) {
	sd := script("v2.0.0", true)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	manifest := func(version, sandboxd string) []byte {
		b, _ := json.Marshal(release.Manifest{Version: version, RunnerImageDigest: "sha256:" + strings.Repeat("a", 64),
			AgentImageDigest: "sha256:" + strings.Repeat("b", 64), Binaries: map[string]release.Binaries{"amd64": {Sandboxd: sandboxd}}})
		return b
	}
	for name, tc := range map[string]struct {
		raw []byte
		key ed25519.PrivateKey
		ok  bool
	}{
		"signed":         {manifest("v2.0.0", sum(sd)), priv, true},
		"untrusted key":  {manifest("v2.0.0", sum(sd)), otherPriv, false},
		"other version":  {manifest("v2.0.1", sum(sd)), priv, false},
		"other checksum": {manifest("v2.0.0", sum([]byte("x"))), priv, false},
		"no manifest":    {nil, priv, false},
		// The signature (below) is over the untampered bytes.
		"tampered manifest": {append(manifest("v2.0.0", sum(sd)), ' '), priv, false},
	} {
		t.Run(name, func(t *testing.T) {
			tr := newTree(t)
			rel := &fakeRelease{version: "v2.0.0", files: map[string][]byte{"sandboxd": sd}}
			var restarts []string
			u := newUpdater(t, tr, rel, &restarts, func(c *Config) {
				c.Keys = []ed25519.PublicKey{pub}
				c.Manifest = func(context.Context, string) ([]byte, []byte, error) {
					if tc.raw == nil {
						return nil, nil, nil
					}
					signedBytes := tc.raw
					if name == "tampered manifest" {
						signedBytes = manifest("v2.0.0", sum(sd))
					}
					return tc.raw, release.Sign(tc.key, signedBytes), nil
				}
			})
			ok, err := u.Apply(t.Context(), Offer{Version: "v2.0.0", SandboxdSHA256: sum(sd)})
			if ok != tc.ok || (!tc.ok && !errors.Is(err, ErrVerify)) {
				t.Fatalf("apply: %v %v, want ok=%v", ok, err, tc.ok)
			}
			if !tc.ok {
				tr.untouched(t)
			}
		})
	}
}

// TestRunKeepsFailedUntilKnown: before the first heartbeat the offer is unknown; that
// must not make the updater forget (and so retry) the version that failed.
func TestRunKeepsFailedUntilKnown(t *testing.T) {
	tr := newTree(t)
	if err := SaveState(tr.data, State{Failed: "v2.0.0", FailedReason: "rolled back"}); err != nil {
		t.Fatal(err)
	}
	rel := &fakeRelease{version: "v2.0.0", files: map[string][]byte{"sandboxd": script("v2.0.0", true)}}
	var restarts []string
	u := newUpdater(t, tr, rel, &restarts, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	calls := 0
	u.Run(ctx, func() (Offer, bool) {
		calls++
		if calls < 3 {
			return Offer{}, false // no heartbeat yet
		}
		return Offer{Version: "v2.0.0", SandboxdSHA256: sum(rel.files["sandboxd"])}, true
	}, 10*time.Millisecond)
	if rel.fetches != 0 || len(restarts) != 0 || calls < 4 {
		t.Fatalf("failed version retried: %d fetches, %d restarts, %d calls", rel.fetches, len(restarts), calls)
	}
	if st, _ := LoadState(tr.data); st.Failed != "v2.0.0" {
		t.Fatalf("state %+v", st)
	}
}

// TestStateUnknownFields: a state file written by a later release (fields this one does
// not know) loads, and Startup acts on it: a rollback re-executes the older binary on
// the newer one's file. An oversized file is refused; an unreadable one is set aside and
// the runner starts.
func TestStateUnknownFields(t *testing.T) {
	tr := newTree(t)
	p := filepath.Join(tr.data, StateFile)
	write(t, p, `{"trial":{"from":"v1.0.0","to":"v2.0.0","attempts":1,"since":"2026-01-01T00:00:00Z","future_field":{"x":1}},"failed":"","later":true}`)
	st, err := LoadState(tr.data)
	if err != nil || st.Trial == nil || st.Trial.To != "v2.0.0" || st.Trial.Attempts != 1 {
		t.Fatalf("state with unknown fields: %+v %v", st, err)
	}
	if d, err := Startup(tr.data, tr.bins, "v1.0.0", quiet()); d != Run || err != nil {
		t.Fatalf("old version on the new version's file: %v %v", d, err)
	}
	if st, _ := LoadState(tr.data); st.Trial != nil || st.Failed != "v2.0.0" {
		t.Fatalf("trial not settled: %+v", st)
	}

	write(t, p, `{"failed":"`+strings.Repeat("x", maxStateBytes)+`"}`)
	if _, err := LoadState(tr.data); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized state file: %v", err)
	}
	write(t, p, "not json")
	if d, err := Startup(tr.data, tr.bins, "v1.0.0", quiet()); d != Run || err != nil {
		t.Fatalf("unreadable state file: %v %v, want Run", d, err)
	}
	if _, err := os.Stat(p + ".bad"); err != nil {
		t.Fatalf("unreadable state file not set aside: %v", err)
	}
	if st, err := LoadState(tr.data); err != nil || st.Trial != nil {
		t.Fatalf("after setting aside: %+v %v", st, err)
	}
}

// TestStartupCannotRollBack: a crashed trial whose previous sandboxd is gone (.prev
// deleted) is recorded as failed and the current binary runs, on this and later starts,
// instead of every start failing.
func TestStartupCannotRollBack(t *testing.T) {
	tr := newTree(t)
	tr.swap(t, false)
	if d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != Trying || err != nil {
		t.Fatal(d, err)
	}
	if err := os.Remove(prev(tr.bins.Sandboxd)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet())
		if d != Run || err != nil {
			t.Fatalf("start %d after a crash without .prev: %v %v, want Run", i, d, err)
		}
	}
	st, _ := LoadState(tr.data)
	if st.Trial != nil || st.Failed != "v2.0.0" || !strings.Contains(st.FailedReason, "rollback to v1.0.0 failed") {
		t.Fatalf("state %+v", st)
	}
	if read(t, tr.bins.Sandboxd) != "new sandboxd" {
		t.Fatal("binary changed")
	}
}

// TestCleanExitKeepsTrial: a clean stop during the trial (SIGTERM: a restart, a reboot)
// does not count as an attempt; the version stays on trial and can still be confirmed.
// A crash after that clean restart still rolls back.
func TestCleanExitKeepsTrial(t *testing.T) {
	tr := newTree(t)
	tr.swap(t, true)
	if d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != Trying || err != nil {
		t.Fatal(d, err)
	}
	for i := range 3 { // restarted by hand, repeatedly
		if err := CleanExit(tr.data, "v2.0.0"); err != nil {
			t.Fatal(err)
		}
		if d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != Trying || err != nil {
			t.Fatalf("start %d after a clean stop: %v %v, want Trying", i, d, err)
		}
	}
	if read(t, tr.bins.Sandboxd) != "new sandboxd" {
		t.Fatal("rolled back after clean stops")
	}
	// Now it crashes (no clean-exit mark): the next start rolls back.
	if d, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != RolledBack || err != nil {
		t.Fatalf("start after a crash: %v %v, want RolledBack", d, err)
	}
	if read(t, tr.bins.Sandboxd) != "old sandboxd" || read(t, tr.bins.Agent) != "old agent" {
		t.Fatal("not rolled back")
	}

	// A clean stop of another version (or with no trial) changes nothing.
	tr = newTree(t)
	tr.swap(t, false)
	if err := CleanExit(tr.data, "v1.0.0"); err != nil {
		t.Fatal(err)
	}
	if st, _ := LoadState(tr.data); st.Trial == nil || st.Trial.CleanExit {
		t.Fatalf("clean exit of another version marked: %+v", st.Trial)
	}
	// And a clean stop, then confirmation: the trial ends.
	if _, err := Startup(tr.data, tr.bins, "v2.0.0", quiet()); err != nil {
		t.Fatal(err)
	}
	if err := CleanExit(tr.data, "v2.0.0"); err != nil {
		t.Fatal(err)
	}
	if d, _ := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != Trying {
		t.Fatal(d)
	}
	if err := Confirm(tr.data, "v2.0.0"); err != nil {
		t.Fatal(err)
	}
	if d, _ := Startup(tr.data, tr.bins, "v2.0.0", quiet()); d != Run {
		t.Fatal(d)
	}
}

// checkScript is a "sandboxd" that answers `version`, and its flag check by accepting
// or refusing (or, old, not knowing the command).
func checkScript(version, check string) []byte {
	var c string
	switch check {
	case "ok":
		c = "exit 0"
	case "refuse":
		c = "echo 'flag provided but not defined: -gone' >&2; exit 2"
	case "old":
		c = `echo 'sandboxd: unknown command "` + CheckFlagsCommand + `"' >&2; exit 2`
	}
	return []byte("#!/bin/sh\nif [ \"$1\" = version ]; then echo 'sandboxd " + version + "'; exit 0; fi\n" +
		"if [ \"$1\" = " + CheckFlagsCommand + " ] && [ \"$2\" = --gone ]; then " + c + "; fi\nexit 0\n")
}

// TestUpdaterChecksFlags: the new sandboxd must accept the runner's flags before it is
// swapped in; one that refuses them is refused; one too old to check is installed.
func TestUpdaterChecksFlags(t *testing.T) {
	for check, want := range map[string]bool{"ok": true, "refuse": false, "old": true} {
		t.Run(check, func(t *testing.T) {
			tr := newTree(t)
			sd := checkScript("v2.0.0", check)
			rel := &fakeRelease{version: "v2.0.0", files: map[string][]byte{"sandboxd": sd}}
			var restarts []string
			u := newUpdater(t, tr, rel, &restarts, func(c *Config) { c.RunnerArgs = []string{"--gone", "x"} })
			ok, err := u.Apply(t.Context(), Offer{Version: "v2.0.0", SandboxdSHA256: sum(sd)})
			if ok != want {
				t.Fatalf("apply: %v %v, want %v", ok, err, want)
			}
			if !want {
				if !errors.Is(err, ErrVerify) || !strings.Contains(err.Error(), "refuses this runner's flags") || !strings.Contains(err.Error(), "-gone") {
					t.Fatalf("error: %v", err)
				}
				tr.untouched(t)
			}
		})
	}
}
