// Package maintenance decides when a runner may be disturbed (updated, restarted): its
// maintenance policy's windows (a cron expression for each window's start, in UTC, and a
// duration) minus its exclusions (absolute time ranges). A policy without windows allows
// any time outside its exclusions; no policy at all allows any time.
//
// Nothing schedules by it yet: the automatic rollout (issue 18, point 3) is a later slice.
package maintenance

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/robfig/cron/v3"

	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Limits of a policy.
const (
	MaxWindows    = 16
	MaxExclusions = 64
	MinDuration   = 60 * time.Second
	MaxDuration   = 7 * 24 * time.Hour
	MaxReason     = 256 // bytes
)

// Policy is a runner's maintenance policy. The zero Policy allows any time.
type Policy struct {
	Windows    []Window    `json:"windows,omitempty"`
	Exclusions []Exclusion `json:"exclusions,omitempty"`
}

// Window opens at every time its cron expression (standard 5 fields, UTC) names and
// stays open for DurationSeconds: [start, start+duration).
type Window struct {
	Cron            string `json:"cron"`
	DurationSeconds int64  `json:"duration_seconds"`
}

// Exclusion forbids [Start, End), even inside a window.
type Exclusion struct {
	Start  time.Time `json:"start_time"`
	End    time.Time `json:"end_time"`
	Reason string    `json:"reason,omitempty"`
}

// Empty reports whether p has neither windows nor exclusions (it allows any time).
func (p Policy) Empty() bool { return len(p.Windows) == 0 && len(p.Exclusions) == 0 }

// Violation is one problem of a policy; Field is relative to the policy, e.g.
// "windows[0].cron".
type Violation struct {
	Field       string
	Description string
}

// The standard 5-field cron syntax: no seconds, no descriptors (@daily), no time zone.
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// ParseCron parses a standard 5-field cron expression, evaluated in UTC. Time zone
// prefixes (TZ=, CRON_TZ=) are refused: windows are in UTC.
func ParseCron(expr string) (cron.Schedule, error) {
	if strings.Contains(expr, "TZ=") {
		return nil, fmt.Errorf("must not name a time zone: windows are in UTC")
	}
	if len(strings.Fields(expr)) != 5 {
		return nil, fmt.Errorf("must have 5 fields (minute hour day-of-month month day-of-week), got %d", len(strings.Fields(expr)))
	}
	s, err := parse(expr)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// parse guards against a panic in the cron library on hostile input.
func parse(expr string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("cannot be parsed")
		}
	}()
	return parser.Parse(expr)
}

// Validate returns the policy's violations (none when it is valid).
func Validate(p Policy) []Violation {
	var vs []Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	if len(p.Windows) > MaxWindows {
		add("windows", "must hold at most %d windows (got %d)", MaxWindows, len(p.Windows))
	}
	if len(p.Exclusions) > MaxExclusions {
		add("exclusions", "must hold at most %d exclusions (got %d)", MaxExclusions, len(p.Exclusions))
	}
	for i, w := range p.Windows {
		if i >= MaxWindows {
			break
		}
		f := fmt.Sprintf("windows[%d]", i)
		if w.Cron == "" {
			add(f+".cron", "is required: a 5-field cron expression for the window's start, in UTC")
		} else if !utf8.ValidString(w.Cron) {
			add(f+".cron", "must be UTF-8")
		} else if _, err := ParseCron(w.Cron); err != nil {
			add(f+".cron", "is not a 5-field cron expression (%q): %v", textclip.Clip(w.Cron, 64), err)
		}
		if d := w.DurationSeconds; d < int64(MinDuration/time.Second) || d > int64(MaxDuration/time.Second) {
			add(f+".duration_seconds", "must be %d to %d (60 s to 7 days), got %d", int64(MinDuration/time.Second), int64(MaxDuration/time.Second), d)
		}
	}
	for i, e := range p.Exclusions {
		if i >= MaxExclusions {
			break
		}
		f := fmt.Sprintf("exclusions[%d]", i)
		switch {
		case e.Start.IsZero():
			add(f+".start_time", "is required")
		case e.End.IsZero():
			add(f+".end_time", "is required")
		case !e.End.After(e.Start):
			add(f+".end_time", "must be after start_time")
		}
		if len(e.Reason) > MaxReason {
			add(f+".reason", "must be at most %d bytes (got %d)", MaxReason, len(e.Reason))
		} else if !utf8.ValidString(e.Reason) {
			add(f+".reason", "must be UTF-8")
		}
	}
	return vs
}

// maxSteps bounds the search for the next allowed time: every step either passes an
// exclusion's end or a window's start, so a valid policy needs far fewer.
const maxSteps = 4 * (MaxExclusions + MaxWindows + 1)

// Allowed reports whether t is inside one of p's windows (any time, when p has none)
// and inside none of its exclusions. next is t when it is allowed, else the earliest time
// after t that is; it is the zero time when none is found (a cron expression that never
// fires, e.g. 30 February, or exclusions past the cron library's 5-year horizon).
// Windows and exclusions that do not parse or are malformed are ignored: Validate p first.
func Allowed(p Policy, t time.Time) (ok bool, next time.Time) {
	t = t.UTC()
	ws := schedules(p)
	cur := t
	for range maxSteps {
		if !inWindow(ws, cur) {
			n := nextStart(ws, cur)
			if n.IsZero() {
				return false, time.Time{}
			}
			cur = n
			continue
		}
		if end, excluded := exclusionEnd(p.Exclusions, cur); excluded {
			cur = end
			continue
		}
		return cur.Equal(t), cur
	}
	return false, time.Time{}
}

type window struct {
	s cron.Schedule
	d time.Duration
}

func schedules(p Policy) []window {
	var ws []window
	for _, w := range p.Windows {
		s, err := ParseCron(w.Cron)
		if err != nil || w.DurationSeconds <= 0 || w.DurationSeconds > int64(MaxDuration/time.Second) {
			continue
		}
		ws = append(ws, window{s, time.Duration(w.DurationSeconds) * time.Second})
	}
	if len(ws) == 0 && len(p.Windows) > 0 {
		return []window{} // windows given, none usable: never
	}
	return ws
}

// inWindow: a window starting at s covers [s, s+d), so t is covered when the window has
// a start in (t-d, t]. No windows (nil) covers all time.
func inWindow(ws []window, t time.Time) bool {
	if ws == nil {
		return true
	}
	for _, w := range ws {
		if n := w.s.Next(t.Add(-w.d)); !n.IsZero() && !n.After(t) {
			return true
		}
	}
	return false
}

// nextStart is the earliest window start after t (zero when none).
func nextStart(ws []window, t time.Time) time.Time {
	var best time.Time
	for _, w := range ws {
		if n := w.s.Next(t); !n.IsZero() && (best.IsZero() || n.Before(best)) {
			best = n
		}
	}
	return best
}

// exclusionEnd: whether t is excluded, and then the latest end of the exclusions that
// cover it.
func exclusionEnd(es []Exclusion, t time.Time) (time.Time, bool) {
	var end time.Time
	for _, e := range es {
		if !e.Start.After(t) && t.Before(e.End) && e.End.After(end) {
			end = e.End
		}
	}
	return end.UTC(), !end.IsZero()
}
