// Package agent is sandbox-agent, PID 1 of every sandbox: it runs the main command
// (restarting it after a non-zero exit up to the restart limit), reaps zombies, forwards
// stop signals, keeps the main command's logs (internal/logstore) and status.json in the
// state dir, and serves exec, files, logs and status to the runner (AgentService over
// connect-go's gRPC protocol on HTTP/2 cleartext).
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// MaxMessageBytes bounds every message in both directions (files up to ~100 MiB).
const MaxMessageBytes = 128 << 20

// Status reasons.
const (
	ReasonCompleted    = "Completed"
	ReasonError        = "Error"
	ReasonRestartLimit = "RestartLimit"
	ReasonStartError   = "StartError"
	ReasonStopped      = "Stopped"
)

// Options configure Run.
type Options struct {
	Config   *agentconfig.Config
	StateDir string
	// Listener is where the agent serves; Run closes it.
	Listener net.Listener
	Logger   *slog.Logger // nil: discard
	// Root is where /etc/passwd and /etc/group are read from; "" = "/".
	Root string
	// BackoffStart and BackoffMax shape the restart delay (defaults 100 ms, 2 s).
	BackoffStart, BackoffMax time.Duration
	// ShutdownGrace bounds how long in-flight calls may run after the main command ended
	// (default 2 s).
	ShutdownGrace time.Duration
	// StreamStall is how long a stream exec waits for a client that reads nothing while
	// its output buffer is full before it fails with STREAM_BACKPRESSURE (default 30 s).
	StreamStall time.Duration
	// Release ends the hold of an agent whose config has HoldExit: Run returns once the
	// main command has ended and Release is closed. nil: never (the backend kills the
	// agent, see agentconfig.Config.HoldExit).
	Release <-chan struct{}
	// TerminationLog, when set, is a file that exists (the kubelet's
	// /dev/termination-log): the final status is written into it as the agent ends, so
	// the backend learns it from the container's status even when no Watch of its saw
	// the end (a sidecar whose restarts all fell between two connections). Best effort.
	TerminationLog string
}

// Agent is one running agent.
type Agent struct {
	opts    Options
	cfg     *agentconfig.Config
	log     *slog.Logger
	workDir string
	// workDirErr: workDir could not be made (the main command cannot start).
	workDirErr error
	user       userInfo
	userErr    error
	logDir     string
	logw       *logstore.Writer
	devNull    *os.File
	outGrace   time.Duration
	// streamStall: see Options.StreamStall.
	streamStall time.Duration

	mu      sync.Mutex
	status  *agentv1.StatusResponse
	version uint64
	// statusWritten: status.json has been written by this agent (see update).
	statusWritten bool
	changed       chan struct{}
	done          chan struct{} // closed once the final status is set and logs are closed
	execs         map[*proc]struct{}
	calls         inflight

	// Standby (pooled) agents: cfg, workDir and user are set once, by Start, before
	// started is set and startCh closed; handlers that use them check started first.
	started atomic.Bool
	startMu sync.Mutex
	startCh chan struct{}
	// filesDone is closed once supervise has written Config.Files (or failed to): exec
	// and file calls wait for it, so a call right after the agent answers never misses
	// a file of the spec.
	filesDone chan struct{}
	startDone bool // Start was called, or the agent stopped before it
	// standbyBase is the standby config's Env and WorkingDir: what the Start config is
	// completed with (its Env merged onto them, its empty WorkingDir defaulted), for a
	// backend that holds a container whose environment only the container knows (the
	// Kubernetes backend's multi-container Pods: the image's env, as the kubelet set it).
	standbyBase agentconfig.Config

	// stopMain cancels Run's context (a stop request, as SIGTERM is: the Stop RPC);
	// killMain is closed once the Stop call's grace has run out: the main command's
	// process group gets SIGKILL.
	stopMain context.CancelFunc
	killMain chan struct{}
	killOnce sync.Once
}

// inflight counts running calls.
type inflight struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed while n == 0
}

func (c *inflight) add(d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.zero == nil {
		c.zero = make(chan struct{})
		close(c.zero)
	}
	if c.n == 0 && d > 0 {
		c.zero = make(chan struct{})
	}
	c.n += d
	if c.n == 0 && d < 0 {
		close(c.zero)
	}
}

func (c *inflight) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.add(1)
		defer c.add(-1)
		h.ServeHTTP(w, r)
	})
}

// wait reports whether no call is running within d.
func (c *inflight) wait(d time.Duration) bool {
	c.add(0)
	c.mu.Lock()
	z := c.zero
	c.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-z:
		return true
	case <-t.C:
		return false
	}
}

// ReadStatusFile reads status.json from a state dir (for the runner, after the sandbox
// exited).
func ReadStatusFile(stateDir string) (*agentv1.StatusResponse, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, agentconfig.StatusFile))
	if err != nil {
		return nil, err
	}
	st := &agentv1.StatusResponse{}
	if err := protojson.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("parse %s: %w", agentconfig.StatusFile, err)
	}
	return st, nil
}

// Run runs the agent until the main command has finally ended and returns the process
// exit code the agent should exit with: the main command's last exit code, or 1 when it
// could not start. Cancelling ctx is a stop request (SIGTERM to the main process group,
// no restart, state STOPPED once it exits). With Config.HoldExit it returns only once
// Options.Release is closed as well.
func Run(ctx context.Context, opts Options) (int, error) {
	a, err := newAgent(opts)
	if err != nil {
		if opts.Listener != nil {
			opts.Listener.Close()
		}
		return 1, err
	}
	defer a.devNull.Close()
	ctx, a.stopMain = context.WithCancel(ctx)
	defer a.stopMain()

	path, h := agentv1connect.NewAgentServiceHandler(&service{a: a},
		connect.WithReadMaxBytes(MaxMessageBytes), connect.WithSendMaxBytes(MaxMessageBytes))
	mux := http.NewServeMux()
	mux.Handle(path, a.calls.wrap(h))
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:   mux,
		Protocols: &protos,
		HTTP2:     HTTP2Config(),
		ErrorLog:  slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(opts.Listener) }()

	select {
	case <-a.startCh:
	case <-ctx.Done():
	}
	var code int
	if a.stopInStandby() {
		code = 0
	} else {
		code = a.supervise(ctx)
	}

	// Watch and Logs(follow) calls end now; give other calls (execs) a grace period, then
	// kill what they run so they end too.
	close(a.done)
	if !a.calls.wait(a.opts.ShutdownGrace) {
		a.killExecs()
		a.calls.wait(time.Second)
	}
	// Every call has ended. Let HTTP/2 flush their last frames, then close the
	// connections: Server.Shutdown would wait a second per idle HTTP/2 connection (GOAWAY
	// timeout) and delay the container's exit.
	time.Sleep(20 * time.Millisecond)
	_ = srv.Close()
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		a.log.Warn("serve", "err", err)
	}
	a.killExecs()
	if a.opts.TerminationLog != "" {
		a.writeTerminationLog()
	}
	if a.started.Load() && a.cfg.HoldExit {
		a.log.Info("main command ended; holding until the backend ends the sandbox", "code", code)
		<-a.opts.Release
	}
	return code, nil
}

func newAgent(opts Options) (*Agent, error) {
	if opts.Config == nil {
		return nil, errors.New("agent: config with a main command is required")
	}
	if err := opts.Config.Validate(); err != nil {
		return nil, fmt.Errorf("agent: config: %w", err)
	}
	if opts.Listener == nil {
		return nil, errors.New("agent: listener is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Root == "" {
		opts.Root = "/"
	}
	if opts.BackoffStart <= 0 {
		opts.BackoffStart = 100 * time.Millisecond
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 2 * time.Second
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 2 * time.Second
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("agent: state dir: %w", err)
	}
	logDir := filepath.Join(opts.StateDir, agentconfig.LogsDir)
	logw, err := logstore.Open(logDir, agentconfig.MainLog)
	if err != nil {
		return nil, fmt.Errorf("agent: open log: %w", err)
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		_ = logw.Close()
		return nil, err
	}
	a := &Agent{
		opts:        opts,
		log:         opts.Logger,
		workDir:     "/",
		logDir:      logDir,
		logw:        logw,
		devNull:     devNull,
		outGrace:    200 * time.Millisecond,
		streamStall: cmp.Or(opts.StreamStall, 30*time.Second),
		status:      &agentv1.StatusResponse{State: agentv1.MainState_MAIN_STATE_STARTING},
		changed:     make(chan struct{}),
		done:        make(chan struct{}),
		execs:       make(map[*proc]struct{}),
		startCh:     make(chan struct{}),
		filesDone:   make(chan struct{}),
		killMain:    make(chan struct{}),
		stopMain:    func() {},
	}
	if opts.Config.Standby {
		a.cfg = &agentconfig.Config{Standby: true}
		a.standbyBase = agentconfig.Config{Env: opts.Config.Env, WorkingDir: opts.Config.WorkingDir}
		a.status.State = agentv1.MainState_MAIN_STATE_STANDBY
	} else {
		a.configure(opts.Config)
	}
	getReaper()
	// A status.json of an earlier agent in this state dir (a restarted container of a
	// Pod) must not stand for this one's, whether or not this one writes its first
	// state now (a new agent's STARTING is not written, see statusUnwritten). A failure
	// is logged, as a failed write of status.json is, and the agent starts.
	if err := os.RemoveAll(filepath.Join(opts.StateDir, agentconfig.StatusFile)); err != nil {
		a.log.Error("remove stale status file", "err", err)
	}
	if !statusUnwritten(a.status) {
		a.update(func(*agentv1.StatusResponse) {})
	}
	return a, nil
}

// configure takes the main command's config; once, before started is set.
func (a *Agent) configure(cfg *agentconfig.Config) {
	wd := cfg.WorkingDir
	if wd == "" {
		wd = "/"
	}
	if !filepath.IsAbs(wd) {
		wd = filepath.Join("/", wd)
	}
	a.cfg, a.workDir = cfg, wd
	// A container runtime makes a container's working dir when its image lacks it (runc,
	// so Kubernetes does): a spec may name a new one, on either backend. Made here, before
	// an exec can run in it.
	a.workDirErr = os.MkdirAll(wd, 0o755)
	a.user, a.userErr = resolveUser(cfg.User, a.opts.Root)
	a.startDone = true
	a.started.Store(true)
	close(a.startCh)
}

// stop is the Stop RPC: a stop request (as SIGTERM), and SIGKILL to the main command's
// process group once grace has run out.
func (a *Agent) stop(grace time.Duration) {
	a.stopMain()
	kill := func() { a.killOnce.Do(func() { close(a.killMain) }) }
	if grace <= 0 {
		kill()
		return
	}
	time.AfterFunc(grace, kill)
}

// errNotStarted is what calls that need the main command's config get in standby.
var errNotStarted = errors.New("agent: in standby, not started")

// start leaves standby: cfg is run as if it had been the agent's config file (Start RPC).
func (a *Agent) start(cfg *agentconfig.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Standby {
		return errors.New("agent: Start needs a config with a main command")
	}
	a.startMu.Lock()
	defer a.startMu.Unlock()
	if a.startDone {
		return errAlreadyStarted
	}
	if len(a.standbyBase.Env) > 0 {
		overlay := make(map[string]string, len(cfg.Env))
		for _, kv := range cfg.Env {
			k, v, _ := strings.Cut(kv, "=")
			overlay[k] = v
		}
		cfg.Env = agentconfig.MergeEnv(a.standbyBase.Env, overlay)
	}
	if cfg.WorkingDir == "" {
		cfg.WorkingDir = a.standbyBase.WorkingDir
	}
	a.update(func(s *agentv1.StatusResponse) { s.State = agentv1.MainState_MAIN_STATE_STARTING })
	a.configure(cfg)
	return nil
}

var errAlreadyStarted = errors.New("agent: already started (or stopped)")

// stopInStandby ends an agent that was stopped before Start (nothing ever ran) and
// reports true; false when the agent has its main command to supervise.
func (a *Agent) stopInStandby() bool {
	a.startMu.Lock()
	if a.startDone {
		a.startMu.Unlock()
		return false
	}
	a.startDone = true
	a.startMu.Unlock()
	a.closeLog()
	a.update(func(s *agentv1.StatusResponse) {
		s.State = agentv1.MainState_MAIN_STATE_STOPPED
		s.Reason, s.Message = ReasonStopped, "stopped in standby, before the main command was started"
		s.FinishedAt = timestamppb.Now()
	})
	return true
}

// env is the sandbox environment, with HOME from the user when the config has none.
func (a *Agent) env(overlay map[string]string) []string {
	env := agentconfig.MergeEnv(a.cfg.Env, overlay)
	if !hasEnv(env, "HOME") && a.user.home != "" {
		env = append(env, "HOME="+a.user.home)
	}
	return env
}

// update changes the status, rewrites status.json and wakes watchers.
func (a *Agent) update(f func(*agentv1.StatusResponse)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a.status)
	a.version++
	close(a.changed)
	a.changed = make(chan struct{})
	if !a.statusWritten && statusUnwritten(a.status) {
		return
	}
	a.statusWritten = true
	if err := a.writeStatusFile(a.status); err != nil {
		a.log.Error("write status", "err", err)
	}
}

// statusUnwritten reports whether status.json is left unwritten for st while the agent
// has written none yet: a new agent's STARTING, which its main command's RUNNING (or a
// failure) follows at once. The file's readers take a final state, a restart count and
// a member container's RUNNING from it (runtime/local computeExit and
// ContainerStatuses, the Kubernetes gate); none of them tells STARTING from no file.
// Only an agent started with its config (not held) starts in STARTING: a held agent
// (a pool's or a warm Pod's claim, a group's or multi-container Pod's members, secret
// environment, restored volumes, egress) starts in STANDBY, which is written at once,
// so the saving is only theirs. Each write creates and renames a file in the state dir
// before the agent can answer (bench/ BenchmarkAgentStart). From the first state
// written on, every change is.
func statusUnwritten(st *agentv1.StatusResponse) bool {
	return st.State == agentv1.MainState_MAIN_STATE_STARTING && st.RestartCount == 0
}

// maxTerminationLog is what the kubelet keeps of a termination message.
const maxTerminationLog = 4096

// writeTerminationLog writes the status, on one line, into Options.TerminationLog: an
// existing regular file, never through a symlink, emptied first (nothing the workload
// wrote there stays), the message clipped so that it fits.
func (a *Agent) writeTerminationLog() {
	a.mu.Lock()
	st := proto.Clone(a.status).(*agentv1.StatusResponse)
	a.mu.Unlock()
	f, err := os.OpenFile(a.opts.TerminationLog, os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		a.log.Debug("termination log", "err", err)
		return
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return
	}
	b, err := protojson.Marshal(st)
	if err != nil || len(b) > maxTerminationLog {
		// Valid UTF-8 without control characters (protojson refuses the one and writes
		// each of the others as six bytes), then shorter until it fits.
		msg := strings.Map(func(r rune) rune {
			if unicode.IsControl(r) {
				return ' '
			}
			return r
		}, strings.ToValidUTF8(st.Message, "?"))
		for n := maxTerminationLog / 2; ; n /= 2 {
			st.Message = textclip.Clip(msg, n)
			if b, err = protojson.Marshal(st); err == nil && len(b) <= maxTerminationLog || n == 0 {
				break
			}
		}
	}
	if err != nil || len(b) > maxTerminationLog {
		return
	}
	if _, err := f.Write(b); err != nil {
		a.log.Debug("termination log", "err", err)
	}
}

func (a *Agent) writeStatusFile(st *agentv1.StatusResponse) error {
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(st)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(a.opts.StateDir, agentconfig.StatusFile), b, 0o644, nil)
}

// snapshot returns a copy of the status, its version, a channel closed on the next
// change, and whether the agent is done.
func (a *Agent) snapshot() (*agentv1.StatusResponse, uint64, <-chan struct{}, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	done := false
	select {
	case <-a.done:
		done = true
	default:
	}
	return proto.Clone(a.status).(*agentv1.StatusResponse), a.version, a.changed, done
}

func (a *Agent) trackExec(p *proc, live bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if live {
		a.execs[p] = struct{}{}
	} else {
		delete(a.execs, p)
	}
}

func (a *Agent) killExecs() {
	a.mu.Lock()
	ps := make([]*proc, 0, len(a.execs))
	for p := range a.execs {
		ps = append(ps, p)
	}
	a.mu.Unlock()
	for _, p := range ps {
		p.kill(syscall.SIGKILL)
	}
}

// closeLog closes the main command's log. Close syncs the log to disk, so a failure
// means lines may be lost: it is logged.
func (a *Agent) closeLog() {
	if err := a.logw.Close(); err != nil {
		a.log.Warn("close main log", "err", err)
	}
}

// supervise runs the main command to its final end and returns the agent's exit code.
func (a *Agent) supervise(ctx context.Context) int {
	fail := func(reason, msg string) int {
		a.closeLog()
		a.update(func(s *agentv1.StatusResponse) {
			s.State = agentv1.MainState_MAIN_STATE_FAILED
			s.Pid = 0
			s.Reason, s.Message = reason, msg
			s.FinishedAt = timestamppb.Now()
		})
		return 1
	}
	if f := testBeforeFiles.Load(); f != nil {
		(*f)()
	}
	err := a.writeConfigFiles()
	close(a.filesDone)
	if err != nil {
		return fail(ReasonStartError, err.Error())
	}
	if a.workDirErr != nil {
		return fail(ReasonStartError, fmt.Sprintf("working directory %q: %v", a.workDir, unwrapPathErr(a.workDirErr)))
	}
	if a.userErr != nil {
		return fail(ReasonStartError, a.userErr.Error())
	}
	backoff := a.opts.BackoffStart
	restarts := 0
	for {
		started := time.Now()
		p, outDone, err := a.startMain()
		if err != nil {
			var se *startError
			if !errors.As(err, &se) || se.permanent || restarts >= a.cfg.RestartLimit {
				return fail(ReasonStartError, "start main command: "+err.Error())
			}
			a.log.Warn("start main command", "err", err)
		}
		var code int32 = 127
		stopped := false
		if p != nil {
			a.update(func(s *agentv1.StatusResponse) {
				s.State = agentv1.MainState_MAIN_STATE_RUNNING
				s.Pid = int32(p.pid)
				s.RestartCount = int32(restarts)
				s.StartedAt = timestamppb.New(started)
				s.FinishedAt = nil
				s.Reason, s.Message = "", ""
			})
			exited := make(chan int32, 1)
			go func() { exited <- p.wait() }()
			select {
			case code = <-exited:
			case <-ctx.Done():
				stopped = true
				p.kill(syscall.SIGTERM)
				select {
				case code = <-exited:
				case <-a.killMain: // a Stop call's grace ran out
					p.kill(syscall.SIGKILL)
					code = <-exited
				}
			}
			<-outDone
		} else {
			stopped = ctx.Err() != nil
		}
		finished := timestamppb.Now()
		setExit := func(s *agentv1.StatusResponse, state agentv1.MainState, reason, msg string) {
			s.State, s.Reason, s.Message = state, reason, msg
			s.Pid = 0
			s.ExitCode = proto.Int32(code)
			s.FinishedAt = finished
		}
		switch {
		case stopped:
			a.closeLog()
			a.update(func(s *agentv1.StatusResponse) {
				setExit(s, agentv1.MainState_MAIN_STATE_STOPPED, ReasonStopped, "stopped: main command "+describeExit(code))
			})
			return int(code)
		case code == 0:
			a.closeLog()
			a.update(func(s *agentv1.StatusResponse) {
				setExit(s, agentv1.MainState_MAIN_STATE_COMPLETED, ReasonCompleted, "")
			})
			return 0
		case restarts >= a.cfg.RestartLimit:
			a.closeLog()
			a.update(func(s *agentv1.StatusResponse) {
				setExit(s, agentv1.MainState_MAIN_STATE_FAILED, ReasonRestartLimit,
					fmt.Sprintf("main command %s; restart limit %d reached", describeExit(code), a.cfg.RestartLimit))
			})
			return int(code)
		}
		a.update(func(s *agentv1.StatusResponse) {
			setExit(s, agentv1.MainState_MAIN_STATE_RESTARTING, ReasonError, "main command "+describeExit(code))
		})
		if time.Since(started) > 10*time.Second {
			backoff = a.opts.BackoffStart
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			a.closeLog()
			a.update(func(s *agentv1.StatusResponse) {
				setExit(s, agentv1.MainState_MAIN_STATE_STOPPED, ReasonStopped, "stopped while restarting; main command "+describeExit(code))
			})
			return int(code)
		}
		backoff = min(backoff*2, a.opts.BackoffMax)
		restarts++
	}
}

// startMain starts the main command with its output going to the log. Its stdout and
// stderr are one pipe, so the log keeps the order in which the command wrote to them
// (two pipes read side by side cannot tell which write came first). outDone is closed
// when the pipe is drained.
func (a *Agent) startMain() (*proc, <-chan struct{}, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, &startError{msg: err.Error()}
	}
	p, err := startProc(procSpec{
		argv:  a.cfg.Argv,
		env:   a.env(nil),
		dir:   a.workDir,
		cred:  a.user.cred,
		files: [3]*os.File{a.devNull, outW, outW},
	})
	outW.Close()
	if err != nil {
		outR.Close()
		return nil, nil, err
	}
	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		defer outR.Close()
		drain(outR, p.exitedCh, a.outGrace, func(b []byte) {
			if _, err := a.logw.Write(logstore.Combined, b); err != nil {
				a.log.Error("write log", "err", err)
			}
		})
	}()
	return p, outDone, nil
}

// testBeforeFiles, set by tests, runs in supervise before Config.Files are written.
var testBeforeFiles atomic.Pointer[func()]

// writeConfigFiles writes Config.Files before the main command first starts.
func (a *Agent) writeConfigFiles() error {
	for _, f := range a.cfg.Files {
		p, err := a.resolvePath(f.Path)
		if err != nil {
			return fmt.Errorf("config file %q: %w", f.Path, err)
		}
		mode := os.FileMode(f.Mode & 0o7777)
		if mode == 0 {
			mode = 0o644
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("config file %q: %w", f.Path, err)
		}
		if err := writeFileAtomic(p, f.Content, mode, a.user.cred); err != nil {
			return fmt.Errorf("config file %q: %w", f.Path, err)
		}
	}
	return nil
}

// writeFileAtomic writes b to a temp file next to path and renames it into place.
func writeFileAtomic(path string, b []byte, mode os.FileMode, owner *syscall.Credential) error {
	return writeFileAtomicFunc(path, mode, owner, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

// writeFileAtomicFunc is writeFileAtomic with the content written by fill; an error of
// fill is returned as it is and leaves path as it was.
func writeFileAtomicFunc(path string, mode os.FileMode, owner *syscall.Credential, fill func(*os.File) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = fill(f)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && owner != nil && os.Getuid() == 0 {
		err = f.Chown(int(owner.Uid), int(owner.Gid))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
