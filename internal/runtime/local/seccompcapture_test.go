package local

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

// vforkHelperEnv makes the test binary a process whose main thread cannot stop (see
// TestSeccompCaptureTimesOut): it is run by the test, never by hand.
const vforkHelperEnv = "SANDBOXD_TEST_VFORK_HELPER"

func init() {
	if os.Getenv(vforkHelperEnv) == "1" {
		goruntime.LockOSThread() // main runs on the main thread, whose tid is the pid
	}
}

// vforkHelper: the main thread vforks (clone CLONE_VM|CLONE_VFORK): it then waits in
// a killable-only sleep until the child executes or exits, which it never does (it
// reports "ready" and sleeps until killed). The parent never resumes: the test kills
// the process group.
func vforkHelper() {
	msg := []byte("ready\n")
	// Named as the agent is, so that capture gets to the ptrace part at once.
	if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&[]byte(agentComm + "\x00")[0])), 0, 0, 0); err != nil {
		os.Exit(2)
	}
	pid, _, errno := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_VFORK|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if errno != 0 {
		os.Exit(3)
	}
	if pid == 0 { // the child, on the parent's stack: raw system calls only
		unix.RawSyscall(unix.SYS_WRITE, 1, uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)))
		for {
			unix.RawSyscall6(unix.SYS_PPOLL, 0, 0, 0, 0, 0, 0)
		}
	}
	os.Exit(4) // not reached while the child lives
}

// TestSeccompCaptureTimesOut: a sandbox init that does not stop for PTRACE_INTERRUPT
// (here a thread waiting for its vfork child, a killable-only sleep) does not hang the
// capture: it fails within its limit (captureStopLimit), the tracer thread exits (not given back to Go's
// pool as a tracer), so the kernel detaches the process, which runs on untouched; and
// the cache's key is free again (a later create captures).
func TestSeccompCaptureTimesOut(t *testing.T) {
	if !testenv.HaveRoot() {
		t.Skip("needs root (ptrace of another process)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), vforkHelperEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}

	c := newSeccompCache(t.TempDir())
	if !c.startCapture("k") {
		t.Fatal("startCapture: no")
	}
	// The helper's start time is its own: the capture fails before comparing it.
	err = c.capture("k", pid, 0)
	if err == nil || !strings.Contains(err.Error(), "did not stop") {
		t.Fatalf("capture of a process that cannot stop: %v", err)
	}
	if !c.startCapture("k") {
		t.Error("the key stays taken after a failed capture")
	}
	if _, ok := c.program("k"); ok {
		t.Error("a program kept after a failed capture")
	}

	// The tracer thread has exited: the kernel detached the helper, which is not stopped.
	status := func() string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i := 0; !strings.Contains(status(), "\nTracerPid:\t0\n"); i++ {
		if i == 1000 {
			t.Fatalf("the helper is still traced:\n%s", status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := status(); strings.Contains(st, "\nState:\tt") || strings.Contains(st, "\nState:\tT") {
		t.Errorf("the helper is left stopped:\n%s", st)
	}
}
