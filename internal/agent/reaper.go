package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The reaper is the only place that waits for children: one SIGCHLD-driven wait4(-1)
// loop that hands each exit status to the waiter registered for that pid and discards
// the statuses of orphans (re-parented grandchildren). Children are started while the
// reaper's lock is held, so a child that exits at once is never reaped before its waiter
// is registered. Nothing in this process may use exec.Cmd.Wait or os.Process.Wait.
//
// The reaper is also the only place that forks (forkExec): nothing else in this process
// may start one (exec.Cmd, os.StartProcess, pty.Start), so its lock tells when no fork
// is under way (awaitForks).
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	// awaiting, set by tests, runs in awaitForks just before it waits for the lock.
	awaiting func()
}

var (
	reaperOnce sync.Once
	theReaper  *reaper
)

func getReaper() *reaper {
	reaperOnce.Do(func() {
		r := &reaper{waiters: make(map[int]chan syscall.WaitStatus)}
		if os.Getpid() != 1 {
			// Outside a container (tests, a plain process) become the reaper of our
			// descendants' orphans, as PID 1 is.
			_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
		}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			for range ch {
				r.reap()
			}
		}()
		theReaper = r
		r.reap() // children that ended before the handler was installed
	})
	return theReaper
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if c, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			c <- ws
		}
	}
}

// forkExec starts a child and registers its waiter atomically with respect to reaping.
// It holds r.mu until syscall.ForkExec has returned, which it does only once the child
// has exec'd (the child's copies of this process's close-on-exec descriptors are closed
// then) or has failed and been waited for.
func (r *reaper) forkExec(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	c := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = c
	return pid, c, nil
}

// awaitForks waits, at most d, until no fork is under way (r.mu, which forkExec holds
// across syscall.ForkExec, is free), and reports whether it got there. A descriptor this
// process closed before the call is then held by no child of it: a child forked before
// the close has exec'd (or ended), and one forked after it never had it. reap holds
// r.mu only for its wait4(WNOHANG) loop, which does not block, and nothing that holds
// r.mu waits for the caller, so the wait ends; it is bounded all the same (a child could
// stall between fork and exec): on timeout the goroutine takes and drops r.mu later.
func (r *reaper) awaitForks(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		if r.awaiting != nil {
			r.awaiting()
		}
		r.mu.Lock()
		r.mu.Unlock() //nolint:staticcheck // SA2001: taking the lock is the wait
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
