package e2e

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// TestEngineModeRefusedByTheLocalBackend: container-engine control (`sbx compose up
// --engine`) through the gateway to a real local runner, without an engine image and
// with one: the local backend hosts no engine yet, so both refuse it with
// CWSANDBOX_NO_SUITABLE_RUNNER naming why, and nothing is created (never a silent
// fallback to platform control).
func TestEngineModeRefusedByTheLocalBackend(t *testing.T) {
	s := startedStack(t)
	file := "services:\n  web:\n    image: " + busybox() + "\n    command: [\"sleep\", \"600\"]\n"
	for _, tc := range []struct{ name, image, why string }{
		{"no engine image", "", "--engine-image"},
		{"a backend without an engine", "localhost/engine:1", "backend cannot host a container engine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGatewayOn(t, s, func(c *gateway.Config) {
				l := runner.NewLocal("local", s.Runner)
				l.EngineImage = tc.image
				c.Runners = []runner.Handle{l}
			})
			out, errs, code := sbx(g, file, "compose", "up", "-f", "-", "--engine")
			if code == 0 || !strings.Contains(errs, "CWSANDBOX_NO_SUITABLE_RUNNER") || !strings.Contains(errs, tc.why) {
				t.Fatalf("compose up --engine: %d %q %q; want CWSANDBOX_NO_SUITABLE_RUNNER naming %q", code, out, errs, tc.why)
			}
			if n := len(s.Runner.List()); n != 0 {
				t.Errorf("the runner has %d sandboxes after the refusal", n)
			}
		})
	}
}
