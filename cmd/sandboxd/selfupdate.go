package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/selfupdate"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// selfUpdate is a single-host runner's self-update (internal/selfupdate) as the runner
// command drives it: the trial check before anything starts, the updater and trial
// watcher beside the heartbeats, and the re-execution once the runner stopped serving.
type selfUpdate struct {
	dir      string
	bins     selfupdate.Binaries
	keys     []ed25519.PublicKey
	deadline time.Duration
	trying   bool // this start is a new version's trial
	log      *slog.Logger
	// execve is syscall.Exec (tests replace it).
	execve func(path string, argv, env []string) error

	// args are the runner's flags, which a new version must accept before it is swapped in.
	args []string

	mu     sync.Mutex
	reexec string             // why the runner is to re-execute ("" while it is not)
	cancel context.CancelFunc // stops serving
	// stopped: a signal stopped the runner (a restart, a reboot), which is no crash.
	stopped bool
}

// selfUpdateStart prepares self-update for a local-backend runner (nil when off or on
// Kubernetes, which updates its Deployment instead) and settles a pending trial:
// rolledBack means the old binaries are back and must be re-executed now.
func (c runnerConfig) selfUpdateStart(log *slog.Logger) (su *selfUpdate, rolledBack bool, err error) {
	if !c.selfUpdate || c.backend == "kubernetes" {
		return nil, false, nil
	}
	bins, err := runningBinaries()
	if err != nil {
		return nil, false, err
	}
	su = &selfUpdate{dir: c.dataDir, bins: bins, deadline: c.selfUpdateDeadline, log: log, execve: syscall.Exec, args: c.args}
	if c.releaseKeys != "" {
		b, err := os.ReadFile(c.releaseKeys)
		if err != nil {
			return nil, false, fmt.Errorf("--release-keys: %w", err)
		}
		if su.keys, err = release.ParsePublicKeys(b); err != nil {
			return nil, false, fmt.Errorf("--release-keys %s: %w", c.releaseKeys, err)
		}
	}
	d, err := selfupdate.Startup(c.dataDir, su.bins, version, log)
	if err != nil {
		return nil, false, err
	}
	su.trying = d == selfupdate.Trying
	return su, d == selfupdate.RolledBack, nil
}

// runningBinaries are the binaries a self-update replaces: the running sandboxd, and the
// agent the local backend uses ($SANDBOXD_AGENT or beside sandboxd) when one is found
// (the release's replaces it when it has one; none found: sandboxd only).
func runningBinaries() (selfupdate.Binaries, error) {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return selfupdate.Binaries{}, fmt.Errorf("self-update: locate the running sandboxd: %w", err)
	}
	bins := selfupdate.Binaries{Sandboxd: exe}
	if agent, err := stack.FindAgent(); err == nil {
		if bins.Agent, err = filepath.Abs(agent); err != nil {
			bins.Agent = ""
		}
	}
	return bins, nil
}

// lenientDataDir is the --data-dir that args give, found without parsing them (they may
// not parse): the last -data-dir/--data-dir value, else the default.
func lenientDataDir(args []string) string {
	dir := defaultDataDir
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "data-dir" {
			continue
		}
		if hasVal {
			dir = val
		} else if i+1 < len(args) {
			i++
			dir = args[i]
		}
	}
	return dir
}

// refusedFlags handles runner flags that do not parse or validate (refused). When this
// version is on trial (a self-update just put it in place) it restores the previous
// binaries, records why, and re-executes them with the same argv, which the previous
// version accepted; otherwise, or when that fails, refused is returned. The data dir
// comes from lenientDataDir since the flags cannot be parsed.
func refusedFlags(args []string, refused error, log *slog.Logger, execve func(path string, argv, env []string) error, bins func() (selfupdate.Binaries, error)) error {
	dir := lenientDataDir(args)
	st, err := selfupdate.LoadState(dir)
	if err != nil || st.Trial == nil || st.Trial.To != version {
		return refused
	}
	b, err := bins()
	if err != nil {
		return errors.Join(refused, err)
	}
	log.Error("runner update: the new version refuses the runner's flags; rolling back", "from", st.Trial.From, "to", version, "err", refused)
	if err := selfupdate.Rollback(dir, b, fmt.Sprintf("version %s refuses the runner's flags: %v", version, refused)); err != nil {
		return errors.Join(refused, fmt.Errorf("runner update: roll back to %s: %w", st.Trial.From, err))
	}
	su := &selfUpdate{dir: dir, bins: b, log: log, execve: execve}
	return su.exec("rollback from " + version + ": it refuses the runner's flags")
}

// runnerCheckFlags is selfupdate.CheckFlagsCommand: it parses and validates `sandboxd
// runner` flags and returns, starting nothing and touching no state (no trial logic), so
// a running runner can ask a new version whether it will accept its flags.
func runnerCheckFlags(args []string) error {
	var cfg runnerConfig
	return parseRunnerFlags(&cfg, args)
}

// signalled records that a signal stopped the runner (nil-safe).
func (s *selfUpdate) signalled() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
}

// serveCtx is ctx, cancelled too when the runner is to re-execute.
func (s *selfUpdate) serveCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if s != nil {
		s.mu.Lock()
		s.cancel = cancel
		s.mu.Unlock()
	}
	return ctx, cancel
}

// restart has the runner stop serving (sandboxes keep running) and re-execute.
func (s *selfUpdate) restart(reason string) {
	s.mu.Lock()
	s.reexec = reason
	cancel := s.cancel
	s.mu.Unlock()
	s.log.Info("runner update: stopping to re-execute; sandboxes keep running and are re-adopted", "reason", reason)
	if cancel != nil {
		cancel()
	}
}

func (s *selfUpdate) pending() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reexec
}

// exec replaces this process with the sandboxd now in place: same PID, same argv and
// environment, so whatever supervises the runner keeps tracking it.
func (s *selfUpdate) exec(reason string) error {
	s.log.Info("runner update: re-executing", "binary", s.bins.Sandboxd, "reason", reason)
	err := s.execve(s.bins.Sandboxd, os.Args, os.Environ())
	return fmt.Errorf("runner update: re-execute %s: %w", s.bins.Sandboxd, err)
}

// afterRun settles how the runner's run ended: a requested re-execution; or, when a new
// version on trial failed to start, the previous binaries restored and re-executed.
func (s *selfUpdate) afterRun(runErr error) error {
	if s == nil {
		return runErr
	}
	if why := s.pending(); why != "" {
		return s.exec(why)
	}
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped && s.trying {
		// Stopped by a signal during the trial (a restart, a reboot): the next start of
		// this version is not another attempt; the trial goes on then.
		if err := selfupdate.CleanExit(s.dir, version); err != nil {
			s.log.Warn("runner update: could not record the clean stop of the version on trial", "version", version, "err", err)
		}
		return runErr
	}
	if runErr != nil && s.trying {
		s.log.Error("runner update: the new version failed to start; rolling back", "version", version, "err", runErr)
		if err := selfupdate.Rollback(s.dir, s.bins, fmt.Sprintf("version %s failed to start: %v", version, runErr)); err != nil {
			return errors.Join(runErr, err)
		}
		return s.exec("rollback from " + version)
	}
	return runErr
}

// runnerArgs is args, never nil (nil would skip the new version's flag check).
func runnerArgs(args []string) []string {
	if args == nil {
		return []string{}
	}
	return args
}

// report puts the last failed update (from the state file) into a heartbeat.
func (s *selfUpdate) report(st *enroll.Status) {
	if s == nil {
		return
	}
	state, err := selfupdate.LoadState(s.dir)
	if err != nil {
		return
	}
	st.SelfUpdateFailedVersion, st.SelfUpdateFailure = state.Failed, failureReason(state.FailedReason)
}

// maxFailureReason is what the control plane accepts (HeartbeatRequest.self_update_failure).
const maxFailureReason = 1024

// failureReason is reason as a heartbeat can carry it: valid UTF-8 (a proto string; an
// error can quote any bytes, and a heartbeat that does not marshal is not sent at all)
// and at most maxFailureReason bytes, cut on a character boundary and marked.
func failureReason(reason string) string { return textclip.Clip(reason, maxFailureReason) }

// start runs the updater beside the heartbeats: first the trial's watch when this start
// is one (confirm once ready with a heartbeat through, or roll back at the deadline),
// then the versions the heartbeats ask for.
func (s *selfUpdate) start(ctx context.Context, c runnerConfig, creds runnerCredentials, hb *enroll.Heartbeater, local *runner.Local, logger *slog.Logger) error {
	fetcher := enroll.NewArtifactFetcher(creds.ident)
	u, err := selfupdate.New(selfupdate.Config{
		DataDir: c.dataDir, Bins: s.bins, Running: version, Arch: runtime.GOARCH, Fetch: fetcher.Fetch,
		// With keys, a version is installed only if its signed release manifest (read
		// with RunnerRegistrationService.GetRelease) verifies and names these binaries.
		Keys: s.keys, Manifest: fetcher.Manifest,
		Restart: s.restart, Logger: logger,
		// The new sandboxd must accept this runner's flags (it is re-executed with them).
		RunnerArgs: runnerArgs(s.args),
	})
	if err != nil {
		return err
	}
	started := time.Now()
	go func() {
		defer fetcher.Close()
		if s.trying {
			healthy := func() bool {
				if !hb.LastSuccess().After(started) {
					return false
				}
				st, err := enrollStatus(ctx, local)
				return err == nil && st.GetReady()
			}
			if !selfupdate.WatchTrial(ctx, c.dataDir, s.bins, version, s.deadline, healthy, s.restart, logger) {
				return
			}
		}
		u.Run(ctx, func() (selfupdate.Offer, bool) {
			if hb.LastSuccess().Before(started) {
				return selfupdate.Offer{}, false
			}
			v, sd, agent := hb.DesiredBinaries()
			return selfupdate.Offer{Version: v, SandboxdSHA256: sd, AgentSHA256: agent}, true
		}, c.heartbeatInterval)
	}()
	return nil
}
