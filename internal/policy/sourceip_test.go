package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestValidateSourceIPAllowlist(t *testing.T) {
	const f = "policy.control_plane_access.source_ip_allowlist"
	for _, tc := range []struct {
		name   string
		list   string
		fields []string
	}{
		{"absent", `null`, nil},
		{"empty allows none", `[]`, nil},
		{"good", `["203.0.113.0/24", "198.51.100.7", "2001:db8::/32", "::1", "10.0.0.0/8"]`, nil},
		{"bad", `["", " 10.0.0.1", "10.0.0.1/8", "10.0.0.0/33", "host.example", "fe80::1%eth0", "::ffff:10.0.0.1", "::ffff:10.0.0.0/104", "1.2.3.4/"]`,
			[]string{f + "[0]", f + "[1]", f + "[2]", f + "[3]", f + "[4]", f + "[5]", f + "[6]", f + "[7]", f + "[8]"}},
		{"too many", "[" + strings.Repeat(`"10.0.0.1",`, MaxSourceIPAllowlist) + `"10.0.0.2"]`, []string{f}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(`{"control_plane_access": {"source_ip_allowlist": ` + tc.list + `}}`))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range Validate(p) {
				got = append(got, v.Field)
				if v.Description == "" {
					t.Errorf("%s has no description", v.Field)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.fields) {
				t.Errorf("violations %v, want %v", got, tc.fields)
			}
		})
	}
	if _, err := Parse([]byte(`{"control_plane_access": {"source_ip_allowlist": [], "other": 1}}`)); err == nil {
		t.Error("unknown field in control_plane_access accepted")
	}
	if _, err := Parse([]byte(`{"constraints": {"source_ip_allowlist": []}}`)); err == nil {
		t.Error("source_ip_allowlist under constraints accepted: it is top level control_plane_access")
	}
}

func TestSourceAllowed(t *testing.T) {
	p := mustParse(t, `{"control_plane_access": {"source_ip_allowlist": ["127.0.0.1", "10.1.0.0/16", "2001:db8::/32"]}}`)
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true}, {"127.0.0.2", false}, {"10.1.200.3", true}, {"10.2.0.1", false},
		{"::ffff:127.0.0.1", true}, {"::ffff:127.0.0.2", false}, // mapped callers match as IPv4
		{"2001:db8::5", true}, {"2001:db9::5", false}, {"::1", false},
	} {
		if got := SourceAllowed(p, netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("%s: allowed %v, want %v", tc.addr, got, tc.want)
		}
	}
	if SourceAllowed(p, netip.Addr{}) {
		t.Error("an unknown caller is allowed by an allowlist")
	}
	for _, doc := range []string{`{}`, `{"control_plane_access": {}}`} {
		if q := mustParse(t, doc); !SourceAllowed(q, netip.MustParseAddr("192.0.2.1")) || !SourceAllowed(q, netip.Addr{}) {
			t.Errorf("%s limits callers", doc)
		}
	}
	if !SourceAllowed(nil, netip.MustParseAddr("192.0.2.1")) {
		t.Error("the nil policy limits callers")
	}
	none := mustParse(t, `{"control_plane_access": {"source_ip_allowlist": []}}`)
	if SourceAllowed(none, netip.MustParseAddr("127.0.0.1")) {
		t.Error("an empty allowlist allows a caller")
	}
	b, err := Marshal(none)
	if err != nil || !strings.Contains(string(b), `"source_ip_allowlist": []`) {
		t.Errorf("an empty allowlist (allow none) does not survive a round trip: %s %v", b, err)
	}
	if b, _ := Marshal(mustParse(t, `{"control_plane_access": {}}`)); string(b) != "{}" {
		t.Errorf("absent allowlist marshals as %s", b)
	}
}
