package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestHelperProcess is the child of TestCrashAndLog: it hits three points.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("FAILPOINT_HELPER") != "1" {
		t.Skip("helper process")
	}
	Hit("a")
	Hit("b")
	Hit("c")
	Hit("b")
	os.Exit(0)
}

func TestCrashAndLog(t *testing.T) {
	log := filepath.Join(t.TempDir(), "points")
	run := func(env ...string) error {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), append([]string{"FAILPOINT_HELPER=1", LogEnv + "=" + log}, env...)...)
		return cmd.Run()
	}
	if err := run(); err != nil {
		t.Fatalf("run without a crash point: %v", err)
	}
	got, _ := os.ReadFile(log)
	if string(got) != "a\nb\nc\nb\n" {
		t.Fatalf("points logged: %q", got)
	}
	_ = os.Remove(log)
	if err := run(Env + "=b"); !killed(err) {
		t.Fatalf("crash at b: %v, want killed by SIGKILL", err)
	}
	got, _ = os.ReadFile(log)
	if strings.TrimSpace(string(got)) != "a\nb" {
		t.Fatalf("points logged before the crash: %q", got)
	}
	_ = os.Remove(log)
	if err := run(Env + "=b#2"); !killed(err) {
		t.Fatalf("crash at b#2: %v, want killed by SIGKILL", err)
	}
	got, _ = os.ReadFile(log)
	if strings.TrimSpace(string(got)) != "a\nb\nc\nb" {
		t.Fatalf("points logged before the crash at b#2: %q", got)
	}
}

func killed(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
}

func TestHitWithoutConfigIsANoop(t *testing.T) {
	if active.Load() != nil {
		t.Skip("the test process itself has a failpoint configured")
	}
	Hit("anything") // must neither crash nor block
}
