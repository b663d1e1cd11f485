package main

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/selfupdate"
)

// TestSelfUpdateAfterRun: a new version on trial whose start-up fails restores the
// previous binaries and re-executes them; a requested re-execution re-executes; a plain
// failure or stop outside a trial is returned as it is.
func TestSelfUpdateAfterRun(t *testing.T) {
	dir, binDir := t.TempDir(), t.TempDir()
	sd := filepath.Join(binDir, "sandboxd")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(sd, "old")
	write(sd+".new", "new")
	bins := selfupdate.Binaries{Sandboxd: sd}
	if err := selfupdate.Swap(dir, bins, sd+".new", "", selfupdate.Trial{From: "v0.9.0", To: version}); err != nil {
		t.Fatal(err)
	}
	var execed []string
	execErr := errors.New("exec stubbed")
	su := &selfUpdate{dir: dir, bins: bins, trying: true, log: slog.New(slog.DiscardHandler),
		execve: func(path string, argv, env []string) error {
			b, _ := os.ReadFile(path)
			execed = append(execed, string(b))
			return execErr
		}}
	if err := su.afterRun(errors.New("listen: address in use")); !errors.Is(err, execErr) || len(execed) != 1 || execed[0] != "old" {
		t.Fatalf("failed start-up on trial: %v, exec'd %q (want the old binary)", err, execed)
	}
	st, _ := selfupdate.LoadState(dir)
	if st.Failed != version {
		t.Fatalf("failed version not recorded: %+v", st)
	}
	// And the heartbeats say so.
	var hb enroll.Status
	su.report(&hb)
	if hb.GetSelfUpdateFailedVersion() != version || !strings.Contains(hb.GetSelfUpdateFailure(), "address in use") {
		t.Fatalf("heartbeat: %q %q", hb.GetSelfUpdateFailedVersion(), hb.GetSelfUpdateFailure())
	}

	execed = nil
	su = &selfUpdate{dir: dir, bins: bins, log: slog.New(slog.DiscardHandler), execve: su.execve}
	boom := errors.New("boom")
	if err := su.afterRun(boom); !errors.Is(err, boom) || len(execed) != 0 {
		t.Fatalf("failure outside a trial: %v, exec'd %q", err, execed)
	}
	if err := su.afterRun(nil); err != nil || len(execed) != 0 {
		t.Fatalf("stop: %v, exec'd %q", err, execed)
	}
	su.restart("update to v2")
	if err := su.afterRun(nil); !errors.Is(err, execErr) || len(execed) != 1 {
		t.Fatalf("requested re-execution: %v, exec'd %q", err, execed)
	}
	var none *selfUpdate
	if err := none.afterRun(boom); !errors.Is(err, boom) {
		t.Fatalf("self-update off: %v", err)
	}
}

// A failure reason goes into heartbeats as valid UTF-8 of at most 1024 bytes, even when
// the error quoted other bytes or cutting at 1024 would split a character: otherwise the
// heartbeat would not marshal, or the control plane would refuse it.
func TestFailureReasonFitsAHeartbeat(t *testing.T) {
	for _, in := range []string{"short", strings.Repeat("x", 1023) + "é", "bad \xff byte", strings.Repeat("é", 600), strings.Repeat("\xff", 2000)} {
		got := failureReason(in)
		if len(got) > 1024 || !utf8.ValidString(got) {
			t.Fatalf("failureReason(%d bytes) = %d bytes, valid %v", len(in), len(got), utf8.ValidString(got))
		}
		if utf8.ValidString(in) && len(in) <= 1024 && got != in {
			t.Fatalf("a reason that fits changed: %q -> %q", in, got)
		}
		hb := enroll.Status{SelfUpdateFailedVersion: "v1.0.0", SelfUpdateFailure: got}
		if _, err := proto.Marshal(&hb); err != nil {
			t.Fatalf("heartbeat with %q does not marshal: %v", got, err)
		}
	}
	if got := failureReason(strings.Repeat("x", 1023) + "é"); got != strings.Repeat("x", 1021)+"…" {
		t.Fatalf("cut inside a character, or not marked: %q", got[1015:])
	}
}

// TestRefusedFlagsRollsBack: a new version on trial that refuses the runner's flags
// (here a flag it does not know) restores the previous binaries and re-executes them
// instead of exiting (a supervisor would restart it forever); outside a trial, or on
// another version's trial, the error is returned as it is.
func TestRefusedFlagsRollsBack(t *testing.T) {
	dir, binDir := t.TempDir(), t.TempDir()
	sd := filepath.Join(binDir, "sandboxd")
	for p, s := range map[string]string{sd: "old", sd + ".new": "new"} {
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bins := selfupdate.Binaries{Sandboxd: sd}
	args := []string{"--listen", "127.0.0.1:0", "--data-dir=" + dir, "--flag-of-the-old-version", "x"}
	var cfg runnerConfig
	refused := parseRunnerFlags(&cfg, args)
	if refused == nil {
		t.Fatal("an unknown flag parsed")
	}
	var execed []string
	execErr := errors.New("exec stubbed")
	execve := func(path string, argv, env []string) error {
		b, _ := os.ReadFile(path)
		execed = append(execed, string(b))
		return execErr
	}
	locate := func() (selfupdate.Binaries, error) { return bins, nil }
	log := slog.New(slog.DiscardHandler)

	// No trial: the error as it is.
	if err := refusedFlags(args, refused, log, execve, locate); !errors.Is(err, refused) || len(execed) != 0 {
		t.Fatalf("no trial: %v, exec'd %q", err, execed)
	}
	// Another version on trial (this one is the old one): as it is.
	if err := selfupdate.Swap(dir, bins, sd+".new", "", selfupdate.Trial{From: version, To: "v9.9.9"}); err != nil {
		t.Fatal(err)
	}
	if err := refusedFlags(args, refused, log, execve, locate); !errors.Is(err, refused) || len(execed) != 0 {
		t.Fatalf("other version's trial: %v, exec'd %q", err, execed)
	}
	if err := selfupdate.Rollback(dir, bins, "reset"); err != nil {
		t.Fatal(err)
	}
	if err := selfupdate.SaveState(dir, selfupdate.State{}); err != nil {
		t.Fatal(err)
	}
	// This version on trial: rolled back and the old binary re-executed.
	if err := os.WriteFile(sd+".new", []byte("new"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := selfupdate.Swap(dir, bins, sd+".new", "", selfupdate.Trial{From: "v0.9.0", To: version}); err != nil {
		t.Fatal(err)
	}
	if err := refusedFlags(args, refused, log, execve, locate); !errors.Is(err, execErr) || len(execed) != 1 || execed[0] != "old" {
		t.Fatalf("trial refusing its flags: %v, exec'd %q (want the old binary)", err, execed)
	}
	st, _ := selfupdate.LoadState(dir)
	if st.Failed != version || !strings.Contains(st.FailedReason, "refuses the runner's flags") || !strings.Contains(st.FailedReason, "flag-of-the-old-version") {
		t.Fatalf("failure not recorded: %+v", st)
	}

	// Validation errors count as refusals too (parseRunnerFlags validates).
	if err := parseRunnerFlags(&runnerConfig{}, []string{"--self-update-deadline", "1s"}); err == nil || !strings.Contains(err.Error(), "at least 10s") {
		t.Fatalf("invalid flags: %v", err)
	}
	// And the check the updater runs before a swap accepts what runner accepts.
	if err := runnerCheckFlags([]string{"--data-dir", dir, "--listen", "127.0.0.1:7443"}); err != nil {
		t.Fatalf("check of good flags: %v", err)
	}
	if err := runnerCheckFlags(args); err == nil {
		t.Fatal("check of an unknown flag passed")
	}
}

func TestLenientDataDir(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, defaultDataDir},
		{[]string{"--listen", ":1"}, defaultDataDir},
		{[]string{"--data-dir", "/a"}, "/a"},
		{[]string{"-data-dir", "/a"}, "/a"},
		{[]string{"--data-dir=/b", "--bogus"}, "/b"},
		{[]string{"-data-dir=/b", "--data-dir", "/c"}, "/c"},
		{[]string{"--pki-dir", "/p", "--data-dir"}, defaultDataDir},
		{[]string{"--", "--data-dir", "/x"}, defaultDataDir},
	} {
		if got := lenientDataDir(tc.args); got != tc.want {
			t.Errorf("lenientDataDir(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// TestSelfUpdateCleanStop: a version on trial stopped by a signal (a restart by hand, a
// reboot) records the clean stop, so its next start is not counted as a crash and the
// trial goes on; without the signal (a crash-restart) the next start rolls back.
func TestSelfUpdateCleanStop(t *testing.T) {
	for _, signalled := range []bool{true, false} {
		dir, binDir := t.TempDir(), t.TempDir()
		sd := filepath.Join(binDir, "sandboxd")
		for p, s := range map[string]string{sd: "old", sd + ".new": "new"} {
			if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		bins := selfupdate.Binaries{Sandboxd: sd}
		log := slog.New(slog.DiscardHandler)
		if err := selfupdate.Swap(dir, bins, sd+".new", "", selfupdate.Trial{From: "v0.9.0", To: version}); err != nil {
			t.Fatal(err)
		}
		if d, err := selfupdate.Startup(dir, bins, version, log); d != selfupdate.Trying || err != nil {
			t.Fatal(d, err)
		}
		su := &selfUpdate{dir: dir, bins: bins, trying: true, log: log,
			execve: func(string, []string, []string) error { t.Fatal("exec on a stop"); return nil }}
		if signalled {
			su.signalled()
		}
		if err := su.afterRun(nil); err != nil {
			t.Fatal(err)
		}
		d, err := selfupdate.Startup(dir, bins, version, log)
		if err != nil {
			t.Fatal(err)
		}
		if signalled && d != selfupdate.Trying {
			t.Fatalf("start after a clean stop: %v, want Trying", d)
		}
		if !signalled && d != selfupdate.RolledBack {
			t.Fatalf("start after a crash: %v, want RolledBack", d)
		}
	}
}
