package edge

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

var backend = netip.MustParseAddrPort("10.0.0.2:8080")

func TestTableSetReplacesAndDeletes(t *testing.T) {
	var tb Table
	if _, ok := tb.Lookup(sbxA, 8080); ok {
		t.Fatal("the zero Table has a route")
	}
	a1 := Route{SandboxID: sbxA, Port: 8080, Kind: KindHTTPS, Backend: backend}
	a2 := Route{SandboxID: sbxA, Port: 5432, Kind: KindPassthrough, Backend: backend}
	b1 := Route{SandboxID: sbxB, Port: 8080, Kind: KindHTTPS, Auth: AuthToken, Timeout: time.Minute, Backend: backend}
	for _, step := range []struct {
		id     string
		routes []Route
	}{{sbxA, []Route{a1, a2}}, {sbxB, []Route{b1}}, {sbxA, []Route{a2}}} {
		if err := tb.Set(step.id, step.routes); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := tb.Lookup(sbxA, 8080); ok {
		t.Error("Set did not replace the sandbox's routes")
	}
	if r, ok := tb.Lookup(sbxA, 5432); !ok || r != a2 {
		t.Errorf("Lookup(%s, 5432) = %+v, %v", sbxA, r, ok)
	}
	tb.Delete(sbxB)
	if _, ok := tb.Lookup(sbxB, 8080); ok {
		t.Error("Delete left a route")
	}
	if _, ok := tb.Lookup(sbxA, 5432); !ok {
		t.Error("Delete of one sandbox removed another's route")
	}
}

func TestTableRejectsInvalidRoutes(t *testing.T) {
	ok := Route{SandboxID: sbxA, Port: 8080, Kind: KindHTTPS, Backend: backend}
	for _, tc := range []struct {
		name string
		edit func(*Route)
		want string
	}{
		{"bad ID", func(r *Route) { r.SandboxID = "ABC" }, "sandbox ID"},
		{"port 0", func(r *Route) { r.Port = 0 }, "port 0"},
		{"no kind", func(r *Route) { r.Kind = 0 }, "unknown kind"},
		{"no backend", func(r *Route) { r.Backend = netip.AddrPort{} }, "backend"},
		{"timeout too short", func(r *Route) { r.Timeout = 14 * time.Second }, "request timeout"},
		{"timeout too long", func(r *Route) { r.Timeout = 901 * time.Second }, "request timeout"},
		{"passthrough with auth", func(r *Route) { r.Kind, r.Auth = KindPassthrough, AuthToken }, "cannot have auth"},
		{"passthrough with timeout", func(r *Route) { r.Kind, r.Timeout = KindPassthrough, time.Minute }, "cannot have a request timeout"},
	} {
		r := ok
		tc.edit(&r)
		var tb Table
		err := tb.Set(r.SandboxID, []Route{r})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Set error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	var tb Table
	if err := tb.Set(sbxA, []Route{ok, ok}); err == nil {
		t.Error("Set accepted two routes for one port")
	}
	if err := tb.Set(sbxB, []Route{ok}); err == nil {
		t.Error("Set accepted another sandbox's route")
	}
	if _, found := tb.Lookup(sbxA, 8080); found {
		t.Error("a failed Set changed the table")
	}
}
