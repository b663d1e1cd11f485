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
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/selfupdate"
	"github.com/sandboxd/sandboxd/internal/stack"
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

	mu     sync.Mutex
	reexec string             // why the runner is to re-execute ("" while it is not)
	cancel context.CancelFunc // stops serving
}

// selfUpdateStart prepares self-update for a local-backend runner (nil when off or on
// Kubernetes, which updates its Deployment instead) and settles a pending trial:
// rolledBack means the old binaries are back and must be re-executed now.
func (c runnerConfig) selfUpdateStart(log *slog.Logger) (su *selfUpdate, rolledBack bool, err error) {
	if !c.selfUpdate || c.backend == "kubernetes" {
		return nil, false, nil
	}
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return nil, false, fmt.Errorf("self-update: locate the running sandboxd: %w", err)
	}
	su = &selfUpdate{dir: c.dataDir, bins: selfupdate.Binaries{Sandboxd: exe}, deadline: c.selfUpdateDeadline, log: log, execve: syscall.Exec}
	// The agent the local backend uses ($SANDBOXD_AGENT or beside sandboxd) is replaced
	// with it when the release has one; none found: sandboxd only.
	if agent, err := stack.FindAgent(); err == nil {
		if su.bins.Agent, err = filepath.Abs(agent); err != nil {
			su.bins.Agent = ""
		}
	}
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
	if runErr != nil && s.trying {
		s.log.Error("runner update: the new version failed to start; rolling back", "version", version, "err", runErr)
		if err := selfupdate.Rollback(s.dir, s.bins, fmt.Sprintf("version %s failed to start: %v", version, runErr)); err != nil {
			return errors.Join(runErr, err)
		}
		return s.exec("rollback from " + version)
	}
	return runErr
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
// and at most maxFailureReason bytes, cut on a character boundary.
func failureReason(reason string) string {
	reason = strings.ToValidUTF8(reason, "\uFFFD")
	if len(reason) <= maxFailureReason {
		return reason
	}
	cut := maxFailureReason
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

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
