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
	if got := failureReason(strings.Repeat("x", 1023) + "é"); got != strings.Repeat("x", 1023) {
		t.Fatalf("cut inside a character: %q", got[1020:])
	}
}
