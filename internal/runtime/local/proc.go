package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proc is a pidfd for a process we did not start (the container's init): signals go
// through it race-free and its exit is awaited in the Go netpoller, without a thread per
// waiter and without polling.
type proc struct {
	pid   int
	start uint64 // /proc/<pid>/stat starttime, guards against pid reuse
	f     *os.File
	rc    syscall.RawConn
	// ctr, when set, makes this the proc of a container in a shared gVisor sandbox:
	// pid and f are the sentry's, but signals, exit and wait are the container's
	// (gvisor_group.go).
	ctr *gvContainer
}

// openProc opens pid; with start != 0 the process must also have that start time.
// It returns (nil, nil) when the process is gone.
func openProc(pid int, start uint64) (*proc, error) {
	if pid <= 0 {
		return nil, nil
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	got, err := procStart(pid)
	if err != nil || (start != 0 && got != start) {
		unix.Close(fd)
		return nil, nil // exited (and maybe the pid was reused)
	}
	f := os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &proc{pid: pid, start: got, f: f, rc: rc}, nil
}

// procStart reads the process's start time (clock ticks after boot) from /proc.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	// Fields after comm start with field 3 (state); starttime is field 22.
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, errors.New("short /proc stat")
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}

func (p *proc) signal(sig unix.Signal) error {
	if p.ctr != nil {
		return p.ctr.signal(sig)
	}
	var serr error
	err := p.rc.Control(func(fd uintptr) {
		serr = unix.PidfdSendSignal(int(fd), sig, nil, 0)
	})
	if err != nil {
		return err
	}
	if errors.Is(serr, unix.ESRCH) {
		return nil
	}
	return serr
}

// exited reports without blocking whether the process has exited.
func (p *proc) exited() bool {
	if p.ctr != nil {
		return p.ctr.exited()
	}
	done := false
	_ = p.rc.Control(func(fd uintptr) { done = pollReadable(int(fd)) })
	return done
}

func pollReadable(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err == nil && n > 0
}

// wait blocks until the process has exited or ctx ends.
func (p *proc) wait(ctx context.Context) error {
	if p.ctr != nil {
		return p.ctr.wait(ctx)
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = p.f.SetReadDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	err := p.rc.Read(func(fd uintptr) bool { return pollReadable(int(fd)) })
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (p *proc) close() {
	if p.ctr != nil {
		p.ctr.close()
	}
	p.f.Close()
}
