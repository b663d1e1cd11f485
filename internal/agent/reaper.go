package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The reaper is the only place that waits for children: one SIGCHLD-driven wait4(-1)
// loop that hands each exit status to the waiter registered for that pid and discards
// the statuses of orphans (re-parented grandchildren). Children are started while the
// reaper's lock is held, so a child that exits at once is never reaped before its waiter
// is registered. Nothing in this process may use exec.Cmd.Wait or os.Process.Wait.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
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
