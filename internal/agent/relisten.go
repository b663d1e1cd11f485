package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// Checkpoints under gVisor. runsc cannot save a socket bound on the host (the agent's
// listener, which the gofer made with --host-uds=create: "Cannot save endpoint with
// bound host socket"), nor the host-backed connections accepted on it. So before the
// backend checkpoints a sandbox it sends the agent (PID 1) SuspendSignal: the agent
// closes its listener and every connection it accepted, waits until their descriptors
// are closed — in the agent and in any child it was forking meanwhile: a child holds a
// copy of the agent's descriptors, close-on-exec ones included, from its fork until its
// exec, and runsc refuses the checkpoint while any copy is open — then creates
// SuspendedFile in its state dir, which the backend waits for. After a restore (or a
// checkpoint that failed and left the sandbox running) the backend sends ResumeSignal:
// the agent re-reads its identity from its config file (a fork is restored with a new
// one: its own sandbox ID and secret), listens again and removes SuspendedFile; the
// backend waits until a dial is answered with the identity it expects.
//
// ResumeSignal resumes only while ResumeFile is there (see handleSignals).
//
// A suspended agent also looks for ResumeFile in its state dir every resumePoll and
// resumes as on ResumeSignal when it is there (and removes it). The backend creates it
// before `runsc restore` (and before it lets a paused kernel continue): the restored
// agent then listens again at once, without the signal's round trip through the runsc
// CLI (~10 ms on the resume path). While the kernel is paused or checkpointed nothing
// polls; the poll runs only in the few milliseconds between suspend and pause.
//
// The sandbox's own root can send these signals too; all it gets is its agent's
// channel closed for at most suspendMax, after which the agent listens again by itself.
const (
	SuspendSignal = syscall.SIGUSR1
	ResumeSignal  = syscall.SIGUSR2
	SuspendedFile = "suspended"
	ResumeFile    = "resume"
)

// resumePoll is how often a suspended agent looks for ResumeFile.
var resumePoll = 2 * time.Millisecond

// suspendMax bounds how long the agent stays without a listener without ResumeSignal.
var suspendMax = 60 * time.Second

// relistener is a net.Listener on a unix path that can be closed and opened again
// (suspend, resume) without its Accept returning: http.Server never sees the gap.
type relistener struct {
	addr     string // unix socket path
	stateDir string
	config   string // agent config path (the identity is re-read on resume)
	idl      *identityListener
	forks    *reaper // every fork of the agent goes through it (suspend awaits them)
	// warn logs a suspend whose bounded waits ran out (set by handleSignals, before
	// any suspend; nil: not logged).
	warn func(msg string, args ...any)

	// inflight counts Accept calls on a listener and Read/Write calls on accepted
	// connections: Close of a Go socket closes its descriptor only once the calls in
	// flight on it have returned, and runsc cannot save a sandbox whose host-backed
	// socket is still open, so suspend waits for them (Add under mu, Done without it).
	inflight sync.WaitGroup

	mu  sync.Mutex
	cur net.Listener // nil while suspended
	// suspending is set while a suspend waits (without mu) for the calls in flight:
	// nothing resumes then.
	conns      map[*trackedConn]struct{}
	wake       chan struct{} // closed (and replaced) when cur changes or on Close
	closed     bool
	suspending bool
	// afterAccept, set by tests before Accept is called, runs between a connection's
	// accept and its tracking.
	afterAccept func()
	timer       *time.Timer
}

func newRelistener(addr, stateDir, config string) (*relistener, error) {
	ln, err := listenUnixPath(addr)
	if err != nil {
		return nil, err
	}
	return &relistener{addr: addr, stateDir: stateDir, config: config, forks: getReaper(), cur: ln, conns: map[*trackedConn]struct{}{}, wake: make(chan struct{})}, nil
}

func listenUnixPath(p string) (net.Listener, error) {
	_ = os.Remove(p)
	return net.Listen("unix", p)
}

func (l *relistener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, net.ErrClosed
		}
		ln, wake := l.cur, l.wake
		if ln != nil {
			l.inflight.Add(1)
		}
		l.mu.Unlock()
		if ln == nil {
			<-wake
			continue
		}
		c, err := ln.Accept()
		if err != nil {
			l.inflight.Done()
			l.mu.Lock()
			swapped := l.cur != ln && !l.closed
			l.mu.Unlock()
			if swapped {
				continue
			}
			return nil, err
		}
		if l.afterAccept != nil {
			l.afterAccept()
		}
		// The accepted connection stays counted in flight until it is tracked (a suspend
		// from then on closes it) or closed here: a suspend that came in between waits
		// for this, so it never reports suspended with this host socket still open.
		tc := &trackedConn{Conn: c, l: l}
		l.mu.Lock()
		if l.cur != ln { // suspended meanwhile
			l.mu.Unlock()
			c.Close()
			l.inflight.Done()
			continue
		}
		l.conns[tc] = struct{}{}
		l.mu.Unlock()
		l.inflight.Done()
		return tc, nil
	}
}

func (l *relistener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	close(l.wake)
	l.wake = make(chan struct{})
	if l.cur != nil {
		return l.cur.Close()
	}
	return nil
}

func (l *relistener) Addr() net.Addr {
	return &net.UnixAddr{Name: l.addr, Net: "unix"}
}

// suspend closes the listener and every accepted connection, waits (bounded) until
// their descriptors are closed in the agent and in any child being forked, then creates
// SuspendedFile.
func (l *relistener) suspend() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return net.ErrClosed
	}
	if l.cur != nil {
		_ = l.cur.Close()
		l.cur = nil
	}
	for c := range l.conns {
		_ = c.Conn.Close()
	}
	clear(l.conns)
	l.suspending = true
	l.mu.Unlock()
	// Without mu: an Accept that got a connection just before needs it to close that.
	callsDone := l.awaitClosed()
	// A child forked before the descriptors were closed holds copies of them until its
	// exec (the main command's or an exec's, started right after a create, say): runsc
	// would find the listener's open in it. A fork that starts from now on does not
	// copy them.
	forksDone := l.forks.awaitForks(forkDrain)
	if (!callsDone || !forksDone) && l.warn != nil {
		// Suspended all the same (the backend's wait is bounded too); runsc may then
		// refuse the checkpoint for a bound socket that is this, not the user's.
		l.warn("suspending with descriptors possibly still open", "calls_done", callsDone, "forks_done", forksDone)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.suspending = false
	if l.closed {
		return net.ErrClosed
	}
	_ = os.Remove(l.addr)
	_ = os.Remove(filepath.Join(l.stateDir, ResumeFile)) // a stale one
	if l.timer != nil {
		l.timer.Stop()
	}
	wake := l.wake // this suspension's: closed when it ends
	l.timer = time.AfterFunc(suspendMax, func() { _ = l.resumeOf(wake) })
	go l.pollResume(wake)
	f, err := os.Create(filepath.Join(l.stateDir, SuspendedFile))
	if err != nil {
		return err
	}
	return f.Close()
}

// awaitClosed waits (a while) until the calls in flight on the closed listener and
// connections have returned: their descriptors are then closed. It reports whether they had.
func (l *relistener) awaitClosed() bool {
	done := make(chan struct{})
	go func() { l.inflight.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(suspendDrain):
		return false
	}
}

// suspendDrain bounds awaitClosed.
const suspendDrain = 2 * time.Second

// forkDrain bounds suspend's wait for the forks under way (a var: tests shorten it).
// suspendDrain plus forkDrain stay below the backend's wait for SuspendedFile
// (local.suspendTimeout, 5 s).
var forkDrain = 2 * time.Second

// resume re-reads the identity and listens again (a no-op when listening).
func (l *relistener) resume() error {
	return l.resumeOf(nil)
}

// resumeOf is resume, for the suspension whose wake channel is wake only (nil: any):
// a poll or timer of an ended suspension must not end a later one.
func (l *relistener) resumeOf(wake chan struct{}) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.cur != nil || l.suspending || (wake != nil && wake != l.wake) {
		return nil
	}
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if l.idl != nil {
		if cfg, err := agentconfig.Load(l.config); err == nil && cfg.Identity != nil {
			if err := l.idl.setIdentity(cfg.Identity); err != nil {
				return err
			}
		}
	}
	ln, err := listenUnixPath(l.addr)
	if err != nil {
		return fmt.Errorf("listen again: %w", err)
	}
	l.cur = ln
	close(l.wake)
	l.wake = make(chan struct{})
	_ = os.Remove(filepath.Join(l.stateDir, ResumeFile))
	_ = os.Remove(filepath.Join(l.stateDir, SuspendedFile))
	return nil
}

// pollResume resumes l when ResumeFile appears, for as long as l is suspended (wake,
// the channel of the suspension, is closed when it ends).
func (l *relistener) pollResume(wake chan struct{}) {
	flag := filepath.Join(l.stateDir, ResumeFile)
	t := time.NewTicker(resumePoll)
	defer t.Stop()
	for {
		select {
		case <-wake:
			return
		case <-t.C:
		}
		if _, err := os.Lstat(flag); err == nil {
			_ = l.resumeOf(wake)
			return
		}
	}
}

// handleSignals suspends and resumes l on SuspendSignal and ResumeSignal.
func (l *relistener) handleSignals(log func(msg string, args ...any)) {
	l.warn = log
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, SuspendSignal, ResumeSignal)
	go func() {
		for sig := range ch {
			var err error
			if sig == SuspendSignal {
				err = l.suspend()
			} else if _, serr := os.Lstat(filepath.Join(l.stateDir, ResumeFile)); serr == nil {
				// Only with ResumeFile there: Go delivers pending signals by number, so
				// a ResumeSignal sent before a SuspendSignal can arrive after it; the
				// host removes ResumeFile before it suspends, so a late one is ignored.
				err = l.resume()
			}
			if err != nil && !errors.Is(err, net.ErrClosed) {
				log("checkpoint signal", "signal", sig.String(), "err", err)
			}
		}
	}()
}

type trackedConn struct {
	net.Conn
	l    *relistener
	once sync.Once
}

func (c *trackedConn) Read(p []byte) (int, error) {
	if !c.enter() {
		return 0, net.ErrClosed
	}
	defer c.l.inflight.Done()
	return c.Conn.Read(p)
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if !c.enter() {
		return 0, net.ErrClosed
	}
	defer c.l.inflight.Done()
	return c.Conn.Write(p)
}

// enter counts a call on c in flight unless c was closed by a suspend (no longer
// tracked).
func (c *trackedConn) enter() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if _, ok := c.l.conns[c]; !ok {
		return false
	}
	c.l.inflight.Add(1)
	return true
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
