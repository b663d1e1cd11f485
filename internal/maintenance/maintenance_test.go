package maintenance

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestAllowed(t *testing.T) {
	daily2 := Window{Cron: "0 2 * * *", DurationSeconds: 3600}      // 02:00-03:00 UTC daily
	daily230 := Window{Cron: "30 2 * * *", DurationSeconds: 3600}   // 02:30-03:30, overlaps daily2
	sunday := Window{Cron: "0 22 * * 0", DurationSeconds: 6 * 3600} // Sun 22:00 - Mon 04:00
	for _, c := range []struct {
		name string
		p    Policy
		t    string
		ok   bool
		next string // "" with ok: next == t; "zero": no next
	}{
		{name: "no policy: always", p: Policy{}, t: "2026-03-29T01:30:00Z", ok: true},
		{name: "window start is inside", p: Policy{Windows: []Window{daily2}}, t: "2026-12-02T02:00:00Z", ok: true},
		{name: "inside a window", p: Policy{Windows: []Window{daily2}}, t: "2026-12-02T02:59:59.999Z", ok: true},
		{name: "window end is outside", p: Policy{Windows: []Window{daily2}}, t: "2026-12-02T03:00:00Z", next: "2026-12-03T02:00:00Z"},
		{name: "just before the window", p: Policy{Windows: []Window{daily2}}, t: "2026-12-02T01:59:59.5Z", next: "2026-12-02T02:00:00Z"},
		{name: "overlapping windows: the later one extends", p: Policy{Windows: []Window{daily2, daily230}}, t: "2026-12-02T03:15:00Z", ok: true},
		{name: "overlapping windows: after both", p: Policy{Windows: []Window{daily2, daily230}}, t: "2026-12-02T03:30:00Z", next: "2026-12-03T02:00:00Z"},
		{name: "overlapping windows: the earliest next start", p: Policy{Windows: []Window{daily230, daily2}}, t: "2026-12-02T12:00:00Z", next: "2026-12-03T02:00:00Z"},
		{name: "window across midnight", p: Policy{Windows: []Window{sunday}}, t: "2026-12-07T03:59:00Z", ok: true}, // Monday
		{name: "after the weekly window", p: Policy{Windows: []Window{sunday}}, t: "2026-12-07T04:00:00Z", next: "2026-12-13T22:00:00Z"},
		{
			name: "exclusion covering a window: the next one", t: "2026-12-02T02:10:00Z", next: "2026-12-03T02:00:00Z",
			p: Policy{Windows: []Window{daily2}, Exclusions: []Exclusion{{Start: at("2026-12-02T00:00:00Z"), End: at("2026-12-02T12:00:00Z"), Reason: "release day"}}},
		},
		{
			name: "exclusion covering several windows", t: "2026-12-01T12:00:00Z", next: "2026-12-05T02:00:00Z",
			p: Policy{Windows: []Window{daily2}, Exclusions: []Exclusion{{Start: at("2026-12-02T00:00:00Z"), End: at("2026-12-04T12:00:00Z")}}},
		},
		{
			name: "exclusion ending inside a window: its end", t: "2026-12-02T02:00:00Z", next: "2026-12-02T02:20:00Z",
			p: Policy{Windows: []Window{daily2}, Exclusions: []Exclusion{{Start: at("2026-12-02T01:00:00Z"), End: at("2026-12-02T02:20:00Z")}}},
		},
		{
			name: "chained exclusions", t: "2026-12-02T02:00:00Z", next: "2026-12-02T02:40:00Z",
			p: Policy{Windows: []Window{daily2}, Exclusions: []Exclusion{
				{Start: at("2026-12-02T02:20:00Z"), End: at("2026-12-02T02:40:00Z")},
				{Start: at("2026-12-02T01:00:00Z"), End: at("2026-12-02T02:30:00Z")},
			}},
		},
		{
			name: "exclusion end is allowed (end exclusive)", t: "2026-12-02T02:20:00Z", ok: true,
			p: Policy{Windows: []Window{daily2}, Exclusions: []Exclusion{{Start: at("2026-12-02T01:00:00Z"), End: at("2026-12-02T02:20:00Z")}}},
		},
		{
			name: "no windows, an exclusion: any time but it", t: "2026-12-02T10:00:00Z", next: "2026-12-02T11:00:00Z",
			p: Policy{Exclusions: []Exclusion{{Start: at("2026-12-02T09:00:00Z"), End: at("2026-12-02T11:00:00Z")}}},
		},
		{
			name: "no windows, outside the exclusion", t: "2026-12-02T11:00:00Z", ok: true,
			p: Policy{Exclusions: []Exclusion{{Start: at("2026-12-02T09:00:00Z"), End: at("2026-12-02T11:00:00Z")}}},
		},
		// DST: windows are UTC. 2026-03-29 is the EU switch (01:00 UTC) and 2026-03-08 the US
		// one; the window stays at 02:00 UTC whatever the input's zone.
		{name: "DST night in Europe", p: Policy{Windows: []Window{daily2}}, t: "2026-03-29T02:30:00+00:00", ok: true},
		{name: "a zoned input is UTC inside", p: Policy{Windows: []Window{daily2}}, t: "2026-03-29T04:30:00+02:00", ok: true},
		{name: "a zoned input outside", p: Policy{Windows: []Window{daily2}}, t: "2026-03-08T03:30:00-05:00", next: "2026-03-09T02:00:00Z"},
		{name: "never fires: no next", p: Policy{Windows: []Window{{Cron: "0 0 30 2 *", DurationSeconds: 60}}}, t: "2026-12-02T00:00:00Z", next: "zero"},
	} {
		t.Run(c.name, func(t *testing.T) {
			now := at(c.t)
			ok, next := Allowed(c.p, now)
			if ok != c.ok {
				t.Errorf("Allowed(%s) = %v, want %v", c.t, ok, c.ok)
			}
			switch {
			case c.ok:
				if !next.Equal(now) {
					t.Errorf("next = %v, want %v (now)", next, now)
				}
			case c.next == "zero":
				if !next.IsZero() {
					t.Errorf("next = %v, want none", next)
				}
			default:
				if !next.Equal(at(c.next)) {
					t.Errorf("next = %v, want %s", next, c.next)
				}
				if ok, _ := Allowed(c.p, next); !ok {
					t.Errorf("next %v is not allowed", next)
				}
				if ok, _ := Allowed(c.p, next.Add(-time.Second)); ok && next.Sub(now) > time.Second {
					t.Errorf("%v, before next, is already allowed", next.Add(-time.Second))
				}
			}
			if !next.IsZero() && next.Location() != time.UTC {
				t.Errorf("next %v is not UTC", next)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t0 := at("2026-12-02T00:00:00Z")
	many := func(n int) []Window {
		ws := make([]Window, n)
		for i := range ws {
			ws[i] = Window{Cron: "0 2 * * *", DurationSeconds: 60}
		}
		return ws
	}
	for _, c := range []struct {
		name   string
		p      Policy
		fields []string
	}{
		{name: "empty", p: Policy{}},
		{name: "valid", p: Policy{Windows: []Window{{Cron: "*/15 1-3 * * MON-FRI", DurationSeconds: 7 * 24 * 3600}},
			Exclusions: []Exclusion{{Start: t0, End: t0.Add(time.Hour), Reason: strings.Repeat("x", 256)}}}},
		{name: "16 windows", p: Policy{Windows: many(16)}},
		{name: "17 windows", p: Policy{Windows: many(17)}, fields: []string{"windows"}},
		{name: "65 exclusions", p: Policy{Exclusions: make([]Exclusion, 65)}, fields: append([]string{"exclusions"}, func() []string {
			var fs []string
			for i := range 64 {
				fs = append(fs, "exclusions["+strconv.Itoa(i)+"].start_time")
			}
			return fs
		}()...)},
		{name: "bad cron", p: Policy{Windows: []Window{{Cron: "0 25 * * *", DurationSeconds: 60}}}, fields: []string{"windows[0].cron"}},
		{name: "6 fields", p: Policy{Windows: []Window{{Cron: "0 0 2 * * *", DurationSeconds: 60}}}, fields: []string{"windows[0].cron"}},
		{name: "descriptor", p: Policy{Windows: []Window{{Cron: "@daily", DurationSeconds: 60}}}, fields: []string{"windows[0].cron"}},
		{name: "time zone", p: Policy{Windows: []Window{{Cron: "CRON_TZ=Europe/Berlin 0 2 * * *", DurationSeconds: 60}}}, fields: []string{"windows[0].cron"}},
		{name: "no cron", p: Policy{Windows: []Window{{DurationSeconds: 60}}}, fields: []string{"windows[0].cron"}},
		{name: "short", p: Policy{Windows: []Window{{Cron: "0 2 * * *", DurationSeconds: 59}}}, fields: []string{"windows[0].duration_seconds"}},
		{name: "long", p: Policy{Windows: []Window{{Cron: "0 2 * * *", DurationSeconds: 7*24*3600 + 1}}}, fields: []string{"windows[0].duration_seconds"}},
		{name: "end before start", p: Policy{Exclusions: []Exclusion{{Start: t0, End: t0}}}, fields: []string{"exclusions[0].end_time"}},
		{name: "no end", p: Policy{Exclusions: []Exclusion{{Start: t0}}}, fields: []string{"exclusions[0].end_time"}},
		{name: "reason not UTF-8", p: Policy{Exclusions: []Exclusion{{Start: t0, End: t0.Add(1), Reason: "\x95"}}}, fields: []string{"exclusions[0].reason"}},
		{name: "cron not UTF-8", p: Policy{Windows: []Window{{Cron: "0 2 * * \xff", DurationSeconds: 60}}}, fields: []string{"windows[0].cron"}},
		{name: "long reason", p: Policy{Exclusions: []Exclusion{{Start: t0, End: t0.Add(1), Reason: strings.Repeat("x", 257)}}}, fields: []string{"exclusions[0].reason"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, v := range Validate(c.p) {
				got = append(got, v.Field)
			}
			if strings.Join(got, ",") != strings.Join(c.fields, ",") {
				t.Errorf("violations %v, want %v", got, c.fields)
			}
		})
	}
}

// FuzzValidate: Validate never panics, and for a policy it accepts, Allowed never panics
// and its next is allowed, not before t, and UTC.
func FuzzValidate(f *testing.F) {
	f.Add("0 2 * * *", int64(3600), int64(0), int64(3600), "r", int64(1_800_000_000))
	f.Add("*/5 * * * 1-5", int64(60), int64(-10), int64(10), "", int64(0))
	f.Add("0 0 30 2 *", int64(604800), int64(5), int64(4), "x", int64(1))
	f.Add("CRON_TZ=UTC 0 0 * * *", int64(61), int64(1), int64(2), "", int64(2))
	f.Add("0-59/0 * * * *", int64(600), int64(1), int64(2), "", int64(2))
	f.Fuzz(func(t *testing.T, expr string, dur, start, end int64, reason string, now int64) {
		base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		p := Policy{
			Windows:    []Window{{Cron: expr, DurationSeconds: dur}},
			Exclusions: []Exclusion{{Start: base.Add(time.Duration(start%1e6) * time.Minute), End: base.Add(time.Duration(end%1e6) * time.Minute), Reason: reason}},
		}
		if len(Validate(p)) > 0 {
			return
		}
		tm := base.Add(time.Duration(now%1e6) * time.Minute)
		ok, next := Allowed(p, tm)
		if ok && !next.Equal(tm) {
			t.Fatalf("allowed at %v but next %v", tm, next)
		}
		if next.IsZero() {
			return
		}
		if next.Before(tm) || next.Location() != time.UTC {
			t.Fatalf("next %v before %v or not UTC", next, tm)
		}
		if ok2, _ := Allowed(p, next); !ok2 {
			t.Fatalf("next %v is not allowed", next)
		}
	})
}
