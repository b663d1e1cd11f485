package policy

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Pause lifetime modes (PauseSettings.Lifetime).
const (
	// PauseLifetimeCounts: a paused sandbox's lifetime keeps counting (the default): a
	// sandbox paused past its deadline ends as on expiry.
	PauseLifetimeCounts = "COUNTS"
	// PauseLifetimeHeld: the lifetime does not count while paused (the deadline moves on
	// by the time spent paused, at resume).
	PauseLifetimeHeld = "HELD"
)

// MinIdlePauseSeconds is the shortest idle time after which a sandbox may be paused by
// itself (PauseSettings.IdlePauseSeconds): shorter would pause sandboxes between two
// calls of one client.
const MinIdlePauseSeconds = 60

// PauseSettings (base.pause) are the runner policy's settings of pausing, resolved into
// the spec's Meta at create (Result.Meta; runtime.MetaPauseLifetime, MetaAutoResume,
// MetaIdlePause) and read by the runner. Absent: the lifetime counts while paused,
// auto-resume is on, no idle pause.
type PauseSettings struct {
	// Lifetime is COUNTS (default) or HELD.
	Lifetime string `json:"lifetime,omitempty"`
	// AutoResume: exec, file calls and endpoint traffic resume a paused sandbox first
	// (default true); false: they answer FAILED_PRECONDITION
	// CWSANDBOX_SANDBOX_NOT_RUNNING. PauseSandboxRequest.auto_resume overrides it per
	// pause.
	AutoResume *bool `json:"auto_resume,omitempty"`
	// IdlePauseSeconds pauses a sandbox after that long without exec, file calls or
	// endpoint traffic; 0 = never, else at least MinIdlePauseSeconds and at most the
	// policy's maximum lifetime (constraints.lifetime.max_seconds, else 30 days).
	IdlePauseSeconds int32 `json:"idle_pause_seconds,omitempty"`
}

// pauseMeta is what s puts into a spec's Meta: only what differs from the defaults
// (absent keys are the defaults, so a sandbox created before these settings existed
// behaves as the defaults say).
func pauseMeta(s *PauseSettings) map[string]string {
	if s == nil {
		return nil
	}
	m := map[string]string{}
	if s.Lifetime == PauseLifetimeHeld {
		m[runtime.MetaPauseLifetime] = "held"
	}
	if s.AutoResume != nil && !*s.AutoResume {
		m[runtime.MetaAutoResume] = strconv.FormatBool(false)
	}
	if s.IdlePauseSeconds > 0 {
		m[runtime.MetaIdlePause] = (time.Duration(s.IdlePauseSeconds) * time.Second).String()
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// validatePause checks base.pause; maxLifetime is the policy's maximum lifetime in
// seconds (constraints.lifetime.max_seconds, else the platform's).
func validatePause(s *PauseSettings, maxLifetime int32, add func(field, format string, args ...any)) {
	if s == nil {
		return
	}
	const f = "policy.base.pause."
	switch s.Lifetime {
	case "", PauseLifetimeCounts, PauseLifetimeHeld:
	default:
		add(f+"lifetime", "must be %s or %s, got %q", PauseLifetimeCounts, PauseLifetimeHeld, s.Lifetime)
	}
	switch n := s.IdlePauseSeconds; {
	case n == 0:
	case n < 0:
		add(f+"idle_pause_seconds", "must not be negative (0 = never), got %d", n)
	case n < MinIdlePauseSeconds:
		add(f+"idle_pause_seconds", "must be 0 (never) or at least %d, got %d", MinIdlePauseSeconds, n)
	case n > maxLifetime:
		add(f+"idle_pause_seconds", "%d is above the maximum lifetime %d: the sandbox would end before it idles that long", n, maxLifetime)
	}
}

// String describes s for messages and docs.
func (s *PauseSettings) String() string {
	if s == nil {
		return "lifetime COUNTS, auto_resume true, no idle pause"
	}
	lt := s.Lifetime
	if lt == "" {
		lt = PauseLifetimeCounts
	}
	ar := s.AutoResume == nil || *s.AutoResume
	idle := "no idle pause"
	if s.IdlePauseSeconds > 0 {
		idle = fmt.Sprintf("idle pause after %ds", s.IdlePauseSeconds)
	}
	return fmt.Sprintf("lifetime %s, auto_resume %t, %s", lt, ar, idle)
}
