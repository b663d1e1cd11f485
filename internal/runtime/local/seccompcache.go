package local

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The seccomp filter, compiled once per profile. runc compiles a container's OCI
// seccomp profile with libseccomp in every `runc init` (~10 ms of CPU per create). The
// first runc sandbox of a profile is created as before; then its agent's installed
// filter is read back with ptrace(PTRACE_SECCOMP_GET_FILTER) — byte for byte what
// libseccomp and runc made, runc's ENOSYS stub included — and kept in a file, keyed by
// the profile (and the runtime binary that compiled it). Later sandboxes of that profile
// get a config.json without linux.seccomp, the program mounted read-only at
// agentconfig.SeccompPath and `--seccomp-filter` on the agent's command line: the agent
// installs it (all threads, SECCOMP_FILTER_FLAG_TSYNC) before it does anything else,
// and exits — failing the create — if it cannot (internal/agent/seccomp.go). Only
// with no_new_privs (runc sets it before the exec; a spec without it keeps runc's
// filter) and never under gVisor (no OCI seccomp there). See docs/hardening.md.

// seccompDir (under StateDir) holds the captured programs; ids cannot start with a dot.
const seccompDir = ".seccomp"

// maxSeccompInsns is the kernel's limit of a classic BPF program (BPF_MAXINSNS).
const maxSeccompInsns = 4096

type seccompCache struct {
	dir string

	mu        sync.Mutex
	progs     map[string]string // key -> program file, captured by this process
	capturing map[string]bool
}

func newSeccompCache(stateDir string) *seccompCache {
	return &seccompCache{dir: filepath.Join(stateDir, seccompDir), progs: map[string]string{}, capturing: map[string]bool{}}
}

// seccompKey names a profile as compiled by the runtime binary: a hash of both.
func seccompKey(binary string, p *specs.LinuxSeccomp) (string, error) {
	j, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(binary))
	h.Write([]byte{0})
	h.Write(j)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// program returns the file of key's program, if one was captured (and the file is
// still there: removed behind the backend's back, runc compiles the profile again).
func (c *seccompCache) program(key string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.progs[key]
	if ok {
		if _, err := os.Stat(p); err != nil {
			delete(c.progs, key)
			return "", false
		}
	}
	return p, ok
}

// startCapture reports whether the caller should capture key's program (no one has, and
// no one is at it); it then must call capture.
func (c *seccompCache) startCapture(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.progs[key]; ok || c.capturing[key] {
		return false
	}
	c.capturing[key] = true
	return true
}

// capture reads the filter of the agent pid (a runc container of profile key, just
// started: its init, whose start time is start), once it has exec'd the agent binary,
// and keeps it for key. On failure nothing is kept and a later create tries again.
func (c *seccompCache) capture(key string, pid int, start uint64) error {
	defer func() {
		c.mu.Lock()
		delete(c.capturing, key)
		c.mu.Unlock()
	}()
	if err := waitExec(pid, agentComm, 5*time.Second); err != nil {
		return err
	}
	prog, err := seccompFilterOf(pid, captureStopLimit)
	if err != nil {
		return err
	}
	if got, err := procStart(pid); err != nil || got != start {
		return fmt.Errorf("seccomp capture: pid %d is no longer the sandbox's init", pid) // its filter is not this profile's
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(c.dir, key+".bpf")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, prog, 0o444); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	c.mu.Lock()
	c.progs[key] = path
	c.mu.Unlock()
	return nil
}

// agentComm is the agent's /proc/<pid>/comm (agentconfig.BinaryPath's base name).
const agentComm = "sandbox-agent"

// waitExec waits until pid's comm is comm (runc init has exec'd the agent).
func waitExec(pid int, comm string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == comm {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("seccomp capture: pid %d is still %q", pid, strings.TrimSpace(string(b)))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ptrace(2) requests x/sys does not wrap.
const ptraceSeccompGetFilter = 0x420c

// captureStopLimit bounds how long the capture waits for the agent to stop: a thread
// in an uninterruptible (or killable-only) sleep may not stop for long, or ever.
const captureStopLimit = time.Second

// seccompFilterOf returns the seccomp filter of pid's main thread: attached with
// PTRACE_SEIZE, stopped with PTRACE_INTERRUPT, read with PTRACE_SECCOMP_GET_FILTER,
// detached. It must be the only filter (runc installs one): a stack of several is
// refused. Every ptrace request is made on one OS thread, locked to a goroutine of its
// own: if the tracee does not stop within limit (waited for with WNOHANG), or anything
// fails once it is seized, that thread is not given back to Go's pool: the goroutine
// ends locked, so the thread exits and the kernel detaches the tracee (and drops the
// pending interrupt) — never a pooled thread still the tracer of a sandbox's init.
// Never the process's main thread: Go keeps that one (wedged) when its locked
// goroutine ends, and the tracer with it.
func seccompFilterOf(pid int, limit time.Duration) ([]byte, error) {
	ch := make(chan tracedFilter, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			traceFilter(pid, limit, ch)
			return
		}
		// On the main thread: trace from another, which this one, held, cannot be.
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			traceFilter(pid, limit, ch)
		}()
		<-done
		runtime.UnlockOSThread()
	}()
	r := <-ch
	return r.prog, r.err
}

type tracedFilter struct {
	prog []byte
	err  error
}

// traceFilter runs seccompFilterTraced on the calling goroutine's locked thread and
// sends its result; it unlocks the thread only if that is no tracer of pid afterwards.
func traceFilter(pid int, limit time.Duration, ch chan<- tracedFilter) {
	prog, detached, err := seccompFilterTraced(pid, limit)
	if detached {
		runtime.UnlockOSThread()
	} // else: the goroutine ends locked and its thread exits, the tracer with it
	ch <- tracedFilter{prog, err}
}

// seccompFilterTraced is seccompFilterOf on the locked thread; detached reports that
// the thread is no tracer of pid (never seized, or detached).
func seccompFilterTraced(pid int, limit time.Duration) (prog []byte, detached bool, err error) {
	if err := unix.PtraceSeize(pid); err != nil {
		return nil, true, fmt.Errorf("seccomp capture: seize %d: %w", pid, err)
	}
	// A signal that stopped it on its way in (rather than the interrupt) is delivered
	// on detach: the agent, pid 1, reaps its children on SIGCHLD.
	var inject unix.Signal
	stopped := false
	defer func() {
		if !stopped {
			return // PTRACE_DETACH needs a stopped tracee: the thread's exit detaches it
		}
		_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(pid), 0, uintptr(inject), 0, 0)
		detached = errno == 0
	}()
	if err := unix.PtraceInterrupt(pid); err != nil {
		return nil, false, fmt.Errorf("seccomp capture: interrupt %d: %w", pid, err)
	}
	deadline := time.Now().Add(limit)
	for !stopped {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(pid, &ws, unix.WALL|unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, false, fmt.Errorf("seccomp capture: wait %d: %w", pid, err)
		case wpid == pid && (ws.Exited() || ws.Signaled()):
			return nil, false, fmt.Errorf("seccomp capture: %d ended", pid)
		case wpid == pid && ws.Stopped():
			if ws.TrapCause() != unix.PTRACE_EVENT_STOP {
				inject = ws.StopSignal() // a signal-delivery-stop
			}
			stopped = true
			continue
		}
		if time.Now().After(deadline) {
			return nil, false, fmt.Errorf("seccomp capture: %d did not stop within %v", pid, limit)
		}
		time.Sleep(time.Millisecond)
	}
	get := func(i int, buf []unix.SockFilter) (int, error) {
		var p uintptr
		if len(buf) > 0 {
			p = uintptr(unsafe.Pointer(&buf[0]))
		}
		n, _, errno := unix.Syscall6(unix.SYS_PTRACE, ptraceSeccompGetFilter, uintptr(pid), uintptr(i), p, 0, 0)
		if errno != 0 {
			return 0, errno
		}
		return int(n), nil
	}
	n, err := get(0, nil)
	if err != nil {
		return nil, false, fmt.Errorf("seccomp capture: filter of %d: %w", pid, err)
	}
	if n <= 0 || n > maxSeccompInsns {
		return nil, false, fmt.Errorf("seccomp capture: filter of %d has %d instructions", pid, n)
	}
	if _, err := get(1, nil); !errors.Is(err, unix.ENOENT) {
		return nil, false, fmt.Errorf("seccomp capture: %d has more than one filter (%w)", pid, err)
	}
	buf := make([]unix.SockFilter, n)
	if m, err := get(0, buf); err != nil || m != n {
		return nil, false, fmt.Errorf("seccomp capture: filter of %d: %d of %d instructions: %w", pid, m, n, err)
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), n*int(unsafe.Sizeof(buf[0]))), false, nil
}

// fileSeccomp is the copy of the program a sandbox's agent installs, in its shown dir.
const fileSeccomp = "seccomp.bpf"

// copyProgram copies a kept program to dst, a new read-only file (never through a
// symlink, never over an existing file), and returns its hex SHA-256.
func copyProgram(src, dst string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), f.Close()
}
