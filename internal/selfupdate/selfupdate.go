// Package selfupdate lets a single-host runner (`sandboxd runner` on the local backend)
// move itself to the version the control plane asks for: it downloads the release's
// sandboxd (and sandbox-agent) next to the running binaries, checks their SHA-256 (and
// the signed release manifest when trusted keys are configured) and that the new sandboxd
// runs, keeps the current binaries as *.prev, renames the new ones into place, and has the
// runner stop serving (sandboxes keep running) and re-execute itself: same PID, same
// argv, so a supervisor or test bed keeps tracking it, and the new version re-adopts the
// sandboxes as on any restart.
//
// The new version is on trial until it is ready and a heartbeat went through: a state
// file in the data dir records the trial (from, to, attempts). A trial that fails (start-up
// error, no ready heartbeat before the deadline, or a crash the supervisor restarted)
// restores the *.prev binaries and re-executes the old version, which then remembers the
// failed version and does not try it again until the control plane asks for another.
package selfupdate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// StateFile is the trial's state file in the runner's data dir.
const StateFile = "selfupdate.json"

// MaxAttempts is how many times a version on trial may start before it counts as failed:
// the start that follows the swap is the first; a second start of that version with the
// trial still pending means it died (or was killed) before it confirmed.
const MaxAttempts = 1

// Trial is a version being tried after a swap.
type Trial struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Attempts counts the starts of To since the swap.
	Attempts int       `json:"attempts"`
	Since    time.Time `json:"since"`
	// Agent: sandbox-agent was swapped too (and has a .prev to restore).
	Agent bool `json:"agent,omitempty"`
	// CleanExit: the last run of To ended with a clean stop (SIGTERM/SIGINT: a restart by
	// hand, a supervisor's stop, a reboot), not a crash; its next start is not counted as
	// an attempt, so a healthy version is not rolled back for being restarted.
	CleanExit bool `json:"clean_exit,omitempty"`
}

// State is what the state file holds.
type State struct {
	Trial *Trial `json:"trial,omitempty"`
	// Failed is the last version that failed, and why; it is not tried again while the
	// control plane asks for it.
	Failed       string `json:"failed,omitempty"`
	FailedReason string `json:"failed_reason,omitempty"`
}

// Binaries are the files an update replaces.
type Binaries struct {
	// Sandboxd is the running sandboxd (resolved at start: after a swap
	// /proc/self/exe names a deleted file).
	Sandboxd string
	// Agent is the sandbox-agent the runner uses; "" when it is not to be updated.
	Agent string
}

// prev is where the binary at p is kept while the next version is on trial.
func prev(p string) string { return p + ".prev" }

// maxStateBytes bounds the state file (a few hundred bytes in practice).
const maxStateBytes = 64 << 10

// LoadState reads the state file in dir (the zero State when there is none).
//
// Unknown fields are accepted: the file is this runner's own, and the binary reading it
// is often older than the one that wrote it (a rollback re-executes the previous version
// on the new version's file), so a field a later release adds must not make the older
// one fail to start.
func LoadState(dir string) (State, error) {
	var s State
	p := filepath.Join(dir, StateFile)
	f, err := os.Open(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, nil
	case err != nil:
		return s, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err != nil {
		return s, err
	}
	if len(b) > maxStateBytes {
		return s, fmt.Errorf("%s: larger than %d bytes", p, maxStateBytes)
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&s); err != nil {
		return State{}, fmt.Errorf("%s: %w", p, err)
	}
	return s, nil
}

// SaveState writes the state file atomically (and durably: it must survive a crash of
// the version it describes).
func SaveState(dir string, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writeFileSync(filepath.Join(dir, StateFile), append(b, '\n'), 0o600)
}

// Swap puts the staged (verified) files in place: for each binary, the current file is
// kept as *.prev (a hard link, so the binary never goes missing), then the staged file is
// renamed over it. The trial is recorded first, so a crash anywhere after is rolled back
// on the next start. stagedAgent is "" when the agent is not replaced.
func Swap(dir string, bins Binaries, stagedSandboxd, stagedAgent string, trial Trial) error {
	trial.Agent = stagedAgent != ""
	st, err := LoadState(dir)
	if err != nil {
		return err
	}
	st.Trial = &trial
	if err := SaveState(dir, st); err != nil {
		return fmt.Errorf("record the trial: %w", err)
	}
	pairs := [][2]string{{stagedSandboxd, bins.Sandboxd}}
	if stagedAgent != "" {
		pairs = append(pairs, [2]string{stagedAgent, bins.Agent})
	}
	for _, p := range pairs {
		if err := keepPrev(p[1]); err != nil {
			return fmt.Errorf("keep %s: %w", p[1], err)
		}
	}
	for i, p := range pairs {
		if err := os.Rename(p[0], p[1]); err != nil {
			// Undo what was renamed: the runner goes on with the binaries it has.
			for _, q := range pairs[:i] {
				_ = restore(q[1])
			}
			st.Trial = nil
			_ = SaveState(dir, st)
			return fmt.Errorf("rename %s into place: %w", p[1], err)
		}
		syncDir(filepath.Dir(p[1]))
	}
	return nil
}

// keepPrev makes p.prev the same file as p.
func keepPrev(p string) error {
	tmp := prev(p) + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(p, tmp); err != nil {
		// No hard links here: copy.
		if err := copyFile(p, tmp); err != nil {
			return err
		}
	}
	return os.Rename(tmp, prev(p))
}

// restore renames p.prev back over p.
func restore(p string) error {
	if err := os.Rename(prev(p), p); err != nil {
		return err
	}
	syncDir(filepath.Dir(p))
	return nil
}

// Rollback restores the binaries kept by the trial's swap and records its version as
// failed (with reason). The trial stays recorded until the old version starts and sees
// itself running (Startup).
func Rollback(dir string, bins Binaries, reason string) error {
	_, err := rollback(dir, bins, reason)
	return err
}

// rollback is Rollback; it also reports whether sandboxd itself was restored (so the
// previous version can be re-executed even when the agent could not be).
func rollback(dir string, bins Binaries, reason string) (sandboxdRestored bool, err error) {
	st, err := LoadState(dir)
	if err != nil {
		return false, err
	}
	if st.Trial == nil {
		return false, errors.New("no update on trial")
	}
	var errs []error
	if err := restore(bins.Sandboxd); err != nil {
		errs = append(errs, fmt.Errorf("restore %s: %w", bins.Sandboxd, err))
	} else {
		sandboxdRestored = true
	}
	if st.Trial.Agent && bins.Agent != "" {
		if err := restore(bins.Agent); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", bins.Agent, err))
		}
	}
	st.Failed, st.FailedReason = st.Trial.To, reason
	if err := SaveState(dir, st); err != nil {
		errs = append(errs, err)
	}
	return sandboxdRestored, errors.Join(errs...)
}

// Decision is what Startup tells the runner to do.
type Decision int

const (
	// Run: no update on trial; start as usual.
	Run Decision = iota
	// Trying: this start is the trial of a new version; confirm it once ready and a
	// heartbeat went through (Confirm), or roll back (Rollback) and re-execute.
	Trying
	// RolledBack: the trial failed before (a crash the supervisor restarted); the old
	// binaries are back in place: re-execute them now.
	RolledBack
)

// Startup looks at the trial on a start of version running, before anything else starts.
//
// It does not keep the runner from starting: a state file it cannot read is set aside
// (and logged), and a rollback that cannot restore the previous sandboxd (its .prev is
// gone) is recorded as a failure and the current binary runs, rather than every later
// start failing.
func Startup(dir string, bins Binaries, running string, log *slog.Logger) (Decision, error) {
	st, err := LoadState(dir)
	if err != nil {
		p := filepath.Join(dir, StateFile)
		log.Error("runner update: the state file cannot be read; setting it aside and starting without it", "path", p, "err", err)
		if rerr := os.Rename(p, p+".bad"); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return Run, fmt.Errorf("runner update: set aside %s: %w", p, rerr)
		}
		return Run, nil
	}
	if st.Trial == nil {
		return Run, nil
	}
	t := st.Trial
	switch running {
	case t.To:
		if t.CleanExit {
			// The last run stopped cleanly (a restart, not a crash): this start is not
			// another attempt.
			t.CleanExit = false
		} else {
			t.Attempts++
		}
		if t.Attempts > MaxAttempts {
			reason := fmt.Sprintf("version %s started %d times without confirming (it crashed or was killed before it was ready and heartbeated)", t.To, t.Attempts-1)
			log.Error("runner update: the new version did not confirm; rolling back", "from", t.From, "to", t.To, "attempts", t.Attempts-1)
			restored, err := rollback(dir, bins, reason)
			if restored {
				if err != nil {
					log.Error("runner update: rolled back sandboxd, but not everything", "err", err)
				}
				return RolledBack, nil
			}
			// Nothing to go back to: run this version rather than fail every start.
			log.Error("RUNNER UPDATE: CANNOT ROLL BACK; the previous version cannot be restored, running the new one anyway",
				"from", t.From, "to", t.To, "err", err)
			st, lerr := LoadState(dir)
			if lerr != nil {
				st = State{}
			}
			st.Trial = nil
			st.Failed, st.FailedReason = t.To, fmt.Sprintf("%s; the rollback to %s failed (%v), so the runner runs %s anyway", reason, t.From, err, t.To)
			if err := SaveState(dir, st); err != nil {
				log.Error("runner update: could not record the failed rollback", "err", err)
			}
			return Run, nil
		}
		if err := SaveState(dir, st); err != nil {
			return Run, err
		}
		log.Info("runner update: new version on trial", "from", t.From, "to", t.To, "attempt", t.Attempts)
		return Trying, nil
	case t.From:
		// Back on the old version after a rollback (or the swap never happened).
		if st.Failed == "" {
			st.Failed, st.FailedReason = t.To, "the runner restarted on the old version during the update"
		}
		log.Warn("runner update: back on the previous version", "running", running, "failed", t.To, "reason", st.FailedReason)
	default:
		log.Warn("runner update: the binaries changed during a trial; the trial is dropped", "running", running, "from", t.From, "to", t.To)
	}
	st.Trial = nil
	return Run, SaveState(dir, st)
}

// CleanExit records that running, on trial, stopped cleanly (a signal asked it to): its
// next start is not counted as an attempt (Startup). Nothing happens when running is
// not on trial (confirmed, or another version's trial).
func CleanExit(dir, running string) error {
	st, err := LoadState(dir)
	if err != nil {
		return err
	}
	if st.Trial == nil || st.Trial.To != running {
		return nil
	}
	st.Trial.CleanExit = true
	return SaveState(dir, st)
}

// Confirm ends the trial of running: the update is done. The *.prev files stay (the
// next update replaces them).
func Confirm(dir, running string) error {
	st, err := LoadState(dir)
	if err != nil {
		return err
	}
	if st.Trial == nil || st.Trial.To != running {
		return nil
	}
	st.Trial = nil
	if st.Failed == running {
		st.Failed, st.FailedReason = "", ""
	}
	return SaveState(dir, st)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func writeFileSync(p string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return err
	}
	syncDir(filepath.Dir(p))
	return nil
}

// syncDir makes a rename in dir durable (best effort).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// WatchTrial ends the trial of running: it confirms it once healthy() (ready, and a
// heartbeat went through since this start), or, when deadline passes first, restores the
// previous binaries and calls restart to re-execute them. It returns when either is done
// or ctx ends; it reports whether the version was confirmed.
func WatchTrial(ctx context.Context, dir string, bins Binaries, running string, deadline time.Duration, healthy func() bool, restart func(reason string), log *slog.Logger) bool {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	timeout := time.After(deadline)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timeout:
			reason := fmt.Sprintf("version %s was not ready with a successful heartbeat within %s", running, deadline)
			log.Error("runner update: the new version did not come up; rolling back", "version", running, "deadline", deadline)
			if err := Rollback(dir, bins, reason); err != nil {
				log.Error("runner update: rollback failed; staying on the new version", "err", err)
				return false
			}
			log.Info("runner update: previous binaries restored; re-executing them", "failed", running)
			restart("rollback from " + running)
			return false
		case <-t.C:
			if healthy() {
				if err := Confirm(dir, running); err != nil {
					log.Error("runner update: could not confirm the new version", "version", running, "err", err)
					continue
				}
				log.Info("runner update: new version confirmed (ready, heartbeat accepted)", "version", running)
				return true
			}
		}
	}
}
