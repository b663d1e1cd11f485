package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestEngineModeRefusedWithoutAnEngineImage: container-engine control (`sbx compose up
// --engine`) through the gateway to a real local runner without an engine image is
// refused with CWSANDBOX_NO_SUITABLE_RUNNER naming why, and nothing is created (never a
// silent fallback to platform control).
func TestEngineModeRefusedWithoutAnEngineImage(t *testing.T) {
	s := startedStack(t)
	file := "services:\n  web:\n    image: " + busybox() + "\n    command: [\"sleep\", \"600\"]\n"
	g := startGatewayOn(t, s, func(c *gateway.Config) {
		c.Runners = []runner.Handle{runner.NewLocal("local", s.Runner)}
	})
	out, errs, code := sbx(g, file, "compose", "up", "-f", "-", "--engine")
	if code == 0 || !strings.Contains(errs, "CWSANDBOX_NO_SUITABLE_RUNNER") || !strings.Contains(errs, "--engine-image") {
		t.Fatalf("compose up --engine: %d %q %q; want CWSANDBOX_NO_SUITABLE_RUNNER naming --engine-image", code, out, errs)
	}
	if n := len(s.Runner.List()); n != 0 {
		t.Errorf("the runner has %d sandboxes after the refusal", n)
	}
}

// TestEngineMode: `sbx compose up --engine` through the gateway to a real local runner
// with the engine test image: the sandbox is RUNNING once docker compose brought both
// services up inside (one healthy through the other by name); exec goes to cws-engine,
// where `docker compose stop/start` of one service work; a file whose service exits
// FAILS its sandbox naming the service. Nothing is left behind (startedStack).
func TestEngineMode(t *testing.T) {
	needRunsc(t)
	img, err := testimage.EngineImage()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := testimage.Push(env.Registry, testimage.Engine, img); err != nil {
		t.Fatal(err)
	}
	t.Logf("pushed the engine image in %v", time.Since(start))
	s := startedStack(t)
	g := startGatewayOn(t, s, func(c *gateway.Config) {
		l := runner.NewLocal("local", s.Runner)
		l.EngineImage = env.Registry + "/" + testimage.Engine
		c.Runners = []runner.Handle{l}
	})
	file := `services:
  web:
    image: ` + busybox() + `
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 80 -h /www"]
  client:
    image: ` + busybox() + `
    command: ["sleep", "3600"]
    depends_on: [web]
    healthcheck:
      test: ["CMD", "sh", "-c", "nc -w 2 web 80 </dev/null"]
      interval: 1s
      timeout: 2s
      retries: 30
`
	start = time.Now()
	out, errs, code := sbx(g, file, "compose", "up", "-f", "-", "--engine")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("compose up --engine: %d %q %q", code, out, errs)
	}
	t.Logf("sbx compose up --engine -> RUNNING: %v", time.Since(start))
	defer sbx(g, "", "delete", id)
	const p = "docker compose -p sandbox -f /cws-engine/compose.yaml"
	sh := func(script string) (string, string, int) { return sbx(g, "", "exec", id, "--", "sh", "-c", script) }
	if out, errs, code := sh(p + ` ps -a --format '{{.Service}} {{.State}}' | sort`); code != 0 || out != "client running\nweb running\n" {
		t.Fatalf("docker compose ps: %d %q %q", code, out, errs)
	}
	if out, errs, code := sh(p + ` stop web >/dev/null 2>&1 && ` + p + ` ps -a --format '{{.Service}} {{.State}}' | sort`); code != 0 || out != "client running\nweb exited\n" {
		t.Fatalf("docker compose stop web: %d %q %q", code, out, errs)
	}
	if out, errs, code := sh(p + ` start web >/dev/null 2>&1 && docker exec sandbox-client-1 sh -c 'printf "GET / HTTP/1.0\r\n\r\n" | nc -w 2 web 80'`); code != 0 || !strings.Contains(out, "hello-from-web") {
		t.Fatalf("docker compose start web, then the client fetches it by name: %d %q %q", code, out, errs)
	}

	broken := "services:\n  fine:\n    image: " + busybox() + "\n    command: [\"sleep\", \"600\"]\n  broken:\n    image: " + busybox() + "\n    command: [\"false\"]\n"
	out, errs, code = sbx(g, broken, "compose", "up", "-f", "-", "--engine")
	if code == 0 || !strings.Contains(errs, "failing services: broken") {
		t.Fatalf("compose up --engine of a file whose service exits: %d %q %q; want a failure naming service broken", code, out, errs)
	}
}
