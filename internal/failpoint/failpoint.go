// Package failpoint lets a test kill a process at a named point of its work, to check
// that whatever recovers afterwards finds a true state and leaves nothing behind.
//
// Code marks its steps with Hit("area.step"). A process started with
//
//	SANDBOXD_FAILPOINT=<name>[#N]  is killed with SIGKILL at the first (Nth) Hit of name;
//	SANDBOXD_FAILPOINT_LOG=<file>  appends every name it hits, one a line, to file,
//
// which is how a test first learns the points a run passes and then crashes a fresh
// run at each in turn (the Nth occurrence of a name is the Nth line naming it). Both are read once, at start-up. Without them Hit is one atomic
// load. A process's own environment is its operator's to set, so honouring them in
// production binaries gives nobody a power they did not have (they can kill it anyway).
package failpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Env names the point to crash at; LogEnv the file that records the points hit.
const (
	Env    = "SANDBOXD_FAILPOINT"
	LogEnv = "SANDBOXD_FAILPOINT_LOG"
)

type config struct {
	crashAt string
	nth     int // crash at this hit of crashAt (1: the first)
	mu      sync.Mutex
	hits    int
	log     *os.File
}

var active atomic.Pointer[config]

func init() {
	c := &config{crashAt: os.Getenv(Env), nth: 1}
	if name, n, ok := strings.Cut(c.crashAt, "#"); ok {
		c.crashAt = name
		if v, err := strconv.Atoi(n); err == nil && v > 0 {
			c.nth = v
		}
	}
	if p := os.Getenv(LogEnv); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			c.log = f
		}
	}
	if c.crashAt != "" || c.log != nil {
		active.Store(c)
	}
}

// Hit marks point name: it records it and kills the process if it is the one to crash at.
func Hit(name string) {
	c := active.Load()
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.log != nil {
		_, _ = c.log.WriteString(name + "\n")
	}
	crash := false
	if name == c.crashAt {
		c.hits++
		crash = c.hits == c.nth
	}
	c.mu.Unlock()
	if crash {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught: nothing after this point runs
	}
}
