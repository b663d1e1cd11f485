package egress

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// TestProxyDecisionMetrics: each connection counts one decision: a granted name allowed,
// an ungranted one denied, a granted name that does not resolve an error.
func TestProxyDecisionMetrics(t *testing.T) {
	e := newProxyEnv(t, nil)
	key := func(d string) string { return `cwsandbox_egress_decisions_total{decision="` + d + `"}` }
	for _, tc := range []struct {
		sni, decision string
		ok            bool
	}{
		{"api.example.test", counters.EgressAllowed, true},
		{"other.example.test", counters.EgressDenied, false},
		{"gone.example.test", counters.EgressError, false},
	} {
		before := counters.Values()
		_, _, err := e.get(t, granted, e.in.ClientConfig(tc.sni))
		if (err == nil) != tc.ok {
			t.Fatalf("%s: %v", tc.sni, err)
		}
		after := counters.Values()
		for _, d := range []string{counters.EgressAllowed, counters.EgressDenied, counters.EgressError, counters.EgressLimited, counters.EgressIntercepted} {
			want := 0.0
			if d == tc.decision {
				want = 1
			}
			if got := after[key(d)] - before[key(d)]; got != want {
				t.Errorf("%s: %s grew by %v, want %v", tc.sni, d, got, want)
			}
		}
	}
}
