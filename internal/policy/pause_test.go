package policy

import (
	"maps"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPauseSettingsValidate: base.pause is decoded strictly and every bad value is a
// violation naming its field.
func TestPauseSettingsValidate(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		fields    []string
	}{
		{"absent", `{}`, nil},
		{"all set", `{"base": {"pause": {"lifetime": "HELD", "auto_resume": false, "idle_pause_seconds": 600}}}`, nil},
		{"counts", `{"base": {"pause": {"lifetime": "COUNTS", "auto_resume": true}}}`, nil},
		{"idle at the minimum", `{"base": {"pause": {"idle_pause_seconds": 60}}}`, nil},
		{"idle at the policy max", `{"base": {"pause": {"idle_pause_seconds": 3600}}, "constraints": {"lifetime": {"max_seconds": 3600}}}`, nil},
		{"idle at 30 days", `{"base": {"pause": {"idle_pause_seconds": 2592000}}}`, nil},
		{"bad lifetime", `{"base": {"pause": {"lifetime": "held"}}}`, []string{"policy.base.pause.lifetime"}},
		{"unknown lifetime", `{"base": {"pause": {"lifetime": "FROZEN"}}}`, []string{"policy.base.pause.lifetime"}},
		{"idle negative", `{"base": {"pause": {"idle_pause_seconds": -1}}}`, []string{"policy.base.pause.idle_pause_seconds"}},
		{"idle below 60", `{"base": {"pause": {"idle_pause_seconds": 59}}}`, []string{"policy.base.pause.idle_pause_seconds"}},
		{"idle above the policy max", `{"base": {"pause": {"idle_pause_seconds": 3601}}, "constraints": {"lifetime": {"max_seconds": 3600}}}`,
			[]string{"policy.base.pause.idle_pause_seconds"}},
		{"idle above 30 days", `{"base": {"pause": {"idle_pause_seconds": 2592001}}}`, []string{"policy.base.pause.idle_pause_seconds"}},
		{"both bad", `{"base": {"pause": {"lifetime": "", "idle_pause_seconds": 1}}}`, []string{"policy.base.pause.idle_pause_seconds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			vs := Validate(p)
			var got []string
			for _, v := range vs {
				got = append(got, v.Field)
				if v.Description == "" {
					t.Errorf("%s: no description", v.Field)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.fields, ",") {
				t.Errorf("violations %v, want fields %v", vs, tc.fields)
			}
		})
	}
	for _, doc := range []string{
		`{"base": {"pause": {"lifetme": "HELD"}}}`,
		`{"base": {"pause": {"auto_resume": "no"}}}`,
		`{"base": {"pause": {"idle_pause_seconds": "60"}}}`,
		`{"base": {"pause": true}}`,
	} {
		if _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("Parse(%s) accepted it", doc)
		}
	}
}

// TestPauseSettingsResolveToMeta: the resolution carries base.pause as the runtime's
// Meta keys (only what differs from the defaults), and SetMeta replaces another
// resolution's keys while keeping the rest of the Meta.
func TestPauseSettingsResolveToMeta(t *testing.T) {
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "python:3.11"}}}
	resolve := func(doc string) Result {
		t.Helper()
		p, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if vs := Validate(p); len(vs) > 0 {
			t.Fatal(vs)
		}
		res := ResolveRevision(p, "1", spec, DefaultPlatform())
		if !res.OK() {
			t.Fatal(fmtVs(res.Violations))
		}
		return res
	}
	for _, tc := range []struct {
		name, doc string
		want      map[string]string
	}{
		{"no settings", `{}`, nil},
		{"the defaults spelled out", `{"base": {"pause": {"lifetime": "COUNTS", "auto_resume": true, "idle_pause_seconds": 0}}}`, nil},
		{"held", `{"base": {"pause": {"lifetime": "HELD"}}}`, map[string]string{runtime.MetaPauseLifetime: "held"}},
		{"all", `{"base": {"pause": {"lifetime": "HELD", "auto_resume": false, "idle_pause_seconds": 900}}}`,
			map[string]string{runtime.MetaPauseLifetime: "held", runtime.MetaAutoResume: "false", runtime.MetaIdlePause: "15m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := resolve(tc.doc)
			if got := res.Meta(); !maps.Equal(got, tc.want) {
				t.Errorf("Meta %v, want %v", got, tc.want)
			}
			if d := res.Meta()[runtime.MetaIdlePause]; d != "" {
				if _, err := time.ParseDuration(d); err != nil {
					t.Errorf("idle pause %q is no duration: %v", d, err)
				}
			}
			// Another resolution's settings (the gateway's, say) are replaced, other keys kept.
			m := res.SetMeta(map[string]string{runtime.MetaOrg: "o", runtime.MetaPauseLifetime: "held", runtime.MetaAutoResume: "false", runtime.MetaIdlePause: "1m0s"})
			want := map[string]string{runtime.MetaOrg: "o"}
			maps.Copy(want, tc.want)
			if !maps.Equal(m, want) {
				t.Errorf("SetMeta %v, want %v", m, want)
			}
		})
	}
	if m := resolve(`{}`).SetMeta(nil); m == nil || len(m) != 0 {
		t.Errorf("SetMeta(nil) = %v, want an empty map", m)
	}
}
