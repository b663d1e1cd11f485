package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// A pauseCrash is one step of TestPauseCrash run in a child process (a runner) that a
// failpoint may kill with SIGKILL.
type pauseCrash struct {
	Op     string // create, pause, resume, check
	State  string
	Points string
	Group  bool // a gVisor group: app and a sidecar "side", both counting
}

const pauseCrashEnv = "SBXL_PAUSE_CRASH"

const pauseCrashID = "pc-1"

func (c *pauseCrash) backend(tb testing.TB) *Backend {
	b, err := New(Config{OCIRuntime: testOCIRuntime, StateDir: c.State, AgentBinary: agentBin, CgroupParent: testCgroupParent,
		Images: testImages{layers: []string{busyboxDir}}})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestPauseCrashHelper is the child of TestPauseCrash.
func TestPauseCrashHelper(t *testing.T) {
	raw := os.Getenv(pauseCrashEnv)
	if raw == "" {
		t.Skip("the child process of TestPauseCrash")
	}
	var c pauseCrash
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatal(err)
	}
	b := c.backend(t)
	ctx := context.Background()
	fail := func(f string, args ...any) {
		fmt.Printf(f+"\n", args...)
		os.Exit(3)
	}
	var err error
	switch c.Op {
	case "create":
		sp := volSpec(pauseCrashID, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 32 << 20}}, counterLoop)
		sp.Image = "busybox"
		if c.Group {
			sp.Name = "app"
			sp.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop},
				VolumeMounts: sp.VolumeMounts}}
		}
		_, err = b.Create(ctx, &sp)
		if err == nil {
			sh(t, b, pauseCrashID, "echo r > /rootfile; echo v > /data/f")
		}
	case "pause":
		_, err = b.Pause(ctx, pauseCrashID, true)
	case "resume":
		_, err = b.Resume(ctx, pauseCrashID)
	case "check":
		// A restarted runner: the sandbox is paused with a usable checkpoint, or running
		// with its agent answering; either way it then runs on with its state.
		rs, rerr := b.Recover(ctx)
		if rerr != nil || len(rs) != 1 {
			fail("recover: %+v, %v", rs, rerr)
		}
		r := rs[0]
		switch {
		case r.Paused && r.Released:
			if _, err := b.Resume(ctx, pauseCrashID); err != nil {
				fail("resume of the recovered paused sandbox: %v", err)
			}
			fmt.Println("state: paused")
		case r.Alive:
			fmt.Println("state: running")
		default:
			fail("recovered neither paused nor running: %+v", r)
		}
		c1 := count(t, b, pauseCrashID)
		time.Sleep(300 * time.Millisecond)
		if c2 := count(t, b, pauseCrashID); c2 <= c1 || c1 < 1 {
			fail("counter %d then %d: not running on", c1, c2)
		}
		if out := sh(t, b, pauseCrashID, "cat /rootfile /data/f"); out != "r\nv" {
			fail("files %q", out)
		}
		if c.Group {
			side := func() string {
				out, _, _ := execIn(t, agentClientOf(b, pauseCrashID, "side"), "sh", "-c", "cat /tmp/cnt; cat /data/f")
				return out
			}
			s1 := side()
			time.Sleep(300 * time.Millisecond)
			if s2 := side(); s2 == s1 || !strings.HasSuffix(s2, "\nv\n") {
				fail("side: %q then %q: not running on with the volume", s1, s2)
			}
		}
	}
	if err != nil {
		fail("%s: %v", c.Op, err)
	}
	os.Exit(0)
}

func runPauseCrash(t *testing.T, c pauseCrash, point string) (killed bool, out string) {
	t.Helper()
	raw, _ := json.Marshal(c)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPauseCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), pauseCrashEnv+"="+string(raw), fixtureEnv+"="+filepath.Dir(agentBin),
		cgroupEnv+"="+testCgroupParent, failpoint.Env+"="+point, failpoint.LogEnv+"="+c.Points)
	b, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL && ctx.Err() == nil {
		return true, string(b)
	}
	if err != nil {
		t.Fatalf("child %s (crash at %q): %v\n%s", c.Op, point, err, b)
	}
	return false, string(b)
}

// TestPauseCrash kills a runner with SIGKILL at every step of a checkpoint pause and of
// a resume of a gVisor sandbox; a restarted runner then finds it either paused with a
// usable checkpoint (and resumes it) or running with its agent answering, never paused
// without a checkpoint, and its processes go on counting with their files intact.
func TestPauseCrash(t *testing.T) { testPauseCrash(t, false) }

// TestPauseCrashGroup is TestPauseCrash for a two-container gVisor group: both
// containers run on with their state.
func TestPauseCrashGroup(t *testing.T) { testPauseCrash(t, true) }

func testPauseCrash(t *testing.T, group bool) {
	e := newEnv(t) // cleans up and checks for leaks at the end
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	c := pauseCrash{State: e.state, Points: filepath.Join(t.TempDir(), "points"), Group: group}
	run := func(op, point string) bool {
		c.Op = op
		killed, out := runPauseCrash(t, c, point)
		if op == "check" {
			t.Logf("after %s: %s", point, strings.TrimSpace(lastLine(out)))
		}
		return killed
	}
	run("create", "")
	for _, op := range []string{"pause", "resume"} {
		if op == "resume" {
			run("pause", "")
		}
		_ = os.Remove(c.Points)
		if run(op, "") {
			t.Fatalf("%s killed without a failpoint", op)
		}
		points := crashPoints(t, c.Points)
		if op == "pause" {
			run("resume", "") // back to running for the crashes of pause
		}
		if len(points) < 3 {
			t.Fatalf("%s: only %d failpoints: %v", op, len(points), points)
		}
		for _, p := range points {
			if op == "resume" {
				if run("pause", "") {
					t.Fatal("pause killed without a failpoint")
				}
			}
			if !run(op, p) {
				t.Errorf("%s: failpoint %s not reached", op, p)
			}
			run("check", op+" "+p) // fails the test (child exit 3) if the state is wrong
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "state:") {
			return lines[i]
		}
	}
	return ""
}
