package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// grepPattern is s as an extended regular expression that matches s but whose own text
// does not (its last byte in brackets): grep's command line does not match itself.
func grepPattern(s string) string { return s[:len(s)-1] + "[" + s[len(s)-1:] + "]" }

// placeholderOf is the API_TOKEN placeholder in env output ("" when absent).
func placeholderOf(env string) string {
	for _, l := range strings.Split(env, "\n") {
		if v, ok := strings.CutPrefix(l, "API_TOKEN="); ok {
			return v
		}
	}
	return ""
}

// TestEgressSecretMultiContainer (docs/secrets.md, "Secrets that never enter the
// sandbox"): egress secrets in a multi-container sandbox, used by real clients. The
// primary runs the python image, the sidecar the clients image (Debian's curl and
// Node.js); each container gets the placeholder and trusts the sandbox's CA. curl and
// Node in the sidecar and Python in the primary reach api.inject.test, whose server sees
// the real value; other.inject.test (granted, no secret) sees the placeholder; a host
// not granted is not reached at all. The sidecar's environment, every process's
// environment and command line it can see, and its files hold no trace of the value.
// It also measures a request's latency through the injecting proxy (TLS terminated and
// re-originated) against one spliced through unchanged. With runsc, the same group
// under gVisor.
func TestEgressSecretMultiContainer(t *testing.T) {
	const value = "mc-egress-9f3b7c1d5a2e4406"
	clients, err := testimage.ClientsImage()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skipf("%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.Push(env.Registry, testimage.Clients, clients); err != nil {
		t.Fatal(err)
	}
	clientsRef := env.Registry + "/" + testimage.Clients

	in := egresstest.New(t)
	apiIP, otherIP, nograntIP := in.Addr(t), in.Addr(t), in.Addr(t)
	in.SetA("api.inject.test", apiIP)
	in.SetA("other.inject.test", otherIP)
	in.SetA("nogrant.inject.test", nograntIP)
	apiSrv := in.ServeHTTPS(t, apiIP, "api.inject.test")
	in.ServeHTTPS(t, otherIP, "other.inject.test")
	nograntSrv := in.ServeHTTPS(t, nograntIP, "nogrant.inject.test")

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pol := &policies{}
	pol.set(`{` + gvisorPolicy + `}`) // the gVisor group below pins its class
	e := startEgressSecretEnv(ctx, t, in, value, func(c *gateway.Config) { c.Policies = pol })
	dir, s, cfg, stackDir, g, logs := e.dir, e.s, e.cfg, e.stackDir, e.g, e.logs
	t.Cleanup(func() { finish(t, s, cfg.DataDir) })

	idle := []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}
	sp := &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{
			{Name: "main", Image: env.Python(), Command: "/bin/sh", Args: idle, Primary: proto.Bool(true)},
			{Name: "side", Image: clientsRef, Command: "/bin/sh", Args: idle},
		},
		Network: &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
			{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "api.inject.test"},
				SandboxdSecret: &sandboxv1.EgressSecretInjection{StoreName: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}},
			{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "other.inject.test"}},
		}},
	}
	// A sidecar that sets the placeholder variable itself is refused, naming it.
	bad := proto.Clone(sp).(*sandboxv1.SandboxSpec)
	bad.Containers[1].EnvironmentVariables = map[string]string{"API_TOKEN": "mine"}
	if _, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: bad}})); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `container "side"`) {
		t.Errorf("a sidecar setting the placeholder variable: %v, want INVALID_ARGUMENT naming it", err)
	}

	id := g.create(t, sp, "").GetSandboxId()
	g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	run := func(container string, argv ...string) string {
		t.Helper()
		ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Container: container, Command: argv}))
		if err != nil {
			t.Fatalf("exec in %s: %v", container, err)
		}
		out := string(ex.Msg.GetStdout()) + string(ex.Msg.GetStderr())
		if strings.Contains(out, value) {
			t.Fatalf("exec in %s %q: the output holds the value:\n%s", container, argv, out)
		}
		return out
	}

	// Both containers: the same placeholder, the CA variables, the CA mount.
	envOf := map[string]map[string]string{}
	for _, c := range []string{"main", "side"} {
		m := map[string]string{}
		for _, l := range strings.Split(run(c, "env"), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				m[k] = v
			}
		}
		envOf[c] = m
		if !strings.HasPrefix(m["API_TOKEN"], "sbx-secret-") || m["SSL_CERT_FILE"] != "/etc/sandboxd-egress/bundle.pem" ||
			m["CURL_CA_BUNDLE"] != "/etc/sandboxd-egress/bundle.pem" || m["NODE_EXTRA_CA_CERTS"] != "/etc/sandboxd-egress/ca.pem" {
			t.Errorf("container %s: environment %v", c, m)
		}
	}
	ph := envOf["main"]["API_TOKEN"]
	if envOf["side"]["API_TOKEN"] != ph {
		t.Errorf("placeholders differ: main %q, side %q", ph, envOf["side"]["API_TOKEN"])
	}
	realHash, phHash := egresstest.EchoHash("Bearer "+value), egresstest.EchoHash("Bearer "+ph)

	// curl in the sidecar.
	curl := func(host string) string {
		return run("side", "sh", "-c", `curl -sS --max-time 20 -H "Authorization: Bearer $API_TOKEN" https://`+host+`/echo 2>&1`)
	}
	if got := curl("api.inject.test"); !strings.Contains(got, "authorization="+realHash) {
		t.Errorf("curl to api.inject.test: %q, want the real value's hash %s", got, realHash)
	}
	if got := curl("other.inject.test"); !strings.Contains(got, "authorization="+phHash) {
		t.Errorf("curl to other.inject.test: %q, want the placeholder's hash %s", got, phHash)
	}
	if got := curl("nogrant.inject.test"); strings.Contains(got, "authorization=") {
		t.Errorf("curl to the host not granted got an answer: %q", got)
	}
	if n := nograntSrv.Conns(); n != 0 {
		t.Errorf("the host not granted got %d connections", n)
	}
	// Node.js in the sidecar: NODE_EXTRA_CA_CERTS adds the sandbox CA to its roots
	// (other.inject.test's private CA is not in them: Node is pointed at the bundle
	// with --use-openssl-ca, which reads SSL_CERT_FILE).
	node := func(host string, opts ...string) string {
		js := `const https = require("https");
https.get({host: process.argv[1], path: "/echo", headers: {Authorization: "Bearer " + process.env.API_TOKEN}, timeout: 20000}, r => {
  let b = ""; r.on("data", d => b += d); r.on("end", () => console.log(r.statusCode, b));
}).on("error", e => console.log("error", e.message));`
		return run("side", slices.Concat([]string{"node"}, opts, []string{"-e", js, host})...)
	}
	if got := node("api.inject.test"); !strings.Contains(got, "authorization="+realHash) {
		t.Errorf("node to api.inject.test: %q, want the real value's hash %s", got, realHash)
	}
	if got := node("other.inject.test", "--use-openssl-ca"); !strings.Contains(got, "authorization="+phHash) {
		t.Errorf("node to other.inject.test: %q, want the placeholder's hash %s", got, phHash)
	}
	// Python in the primary, as before.
	py := run("main", "python3", "-c", `import os, urllib.request as u
print(u.urlopen(u.Request("https://api.inject.test/echo", headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]}), timeout=20).read().decode())`)
	if !strings.Contains(py, "authorization="+realHash) {
		t.Errorf("python in the primary: %q", py)
	}

	// The sidecar holds no trace of the value: its environment, the environment and
	// command line of every process it can see, its files (for the value's first 8 bytes).
	scan := run("side", "sh", "-c", `echo "scan begin"; grep -rlsE '`+grepPattern(value[:8])+`' /etc /root /tmp /run /var /home /proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo "scan done"; `+
		`echo "control begin"; grep -rlsE '`+grepPattern("sbx-secret-")+`' /proc/[0-9]*/environ; echo "control done"; `+
		`ls /etc/sandboxd-egress; grep -l "PRIVATE KEY" /etc/sandboxd-egress/* || echo no-key; `+
		`(echo x >> /etc/sandboxd-egress/ca.pem) 2>/dev/null && echo written || echo write-refused`)
	if b, a, ok := strings.Cut(scan, "scan begin\n"); !ok || !strings.HasPrefix(a, "scan done\n") {
		t.Errorf("files or processes of the sidecar hold the value's prefix:\n%s%s", b, a)
	}
	if _, a, ok := strings.Cut(scan, "control begin\n"); !ok || !strings.HasPrefix(a, "/proc/") {
		t.Errorf("the scan's control found no placeholder:\n%s", scan)
	}
	if !strings.Contains(scan, "no-key") || !strings.Contains(scan, "write-refused") ||
		!strings.Contains(scan, "bundle.pem") {
		t.Errorf("sidecar scan:\n%s", scan)
	}

	// Latency: curl's time_total of n requests, each on a new connection, through the
	// injecting proxy (api.inject.test) and spliced (other.inject.test).
	const n = 20
	lat := func(host string) time.Duration {
		out := run("side", "sh", "-c", `for i in $(seq `+strconv.Itoa(n)+`); do curl -s -o /dev/null --max-time 20 -w '%{time_total}\n' -H "Authorization: Bearer $API_TOKEN" https://`+host+`/echo; done`)
		var ds []time.Duration
		for _, l := range strings.Fields(out) {
			f, err := strconv.ParseFloat(l, 64)
			if err != nil {
				t.Fatalf("curl timing %q: %v", out, err)
			}
			ds = append(ds, time.Duration(f*float64(time.Second)))
		}
		if len(ds) != n {
			t.Fatalf("curl timings: %q", out)
		}
		slices.Sort(ds)
		return ds[n/2]
	}
	before := apiSrv.Conns()
	injected, spliced := lat("api.inject.test"), lat("other.inject.test")
	t.Logf("curl request (new TLS connection each) median of %d: injected %v, spliced %v (+%v)", n, injected, spliced, injected-spliced)
	if got := apiSrv.Conns() - before; got != n {
		t.Errorf("api.inject.test got %d connections for %d requests", got, n)
	}

	// The same group under gVisor (one sentry; the members mount the same CA dir):
	// curl in the sidecar gets the value injected, another host the placeholder.
	gvisorUses := 0
	if local.FindRunsc() != "" {
		gsp := proto.Clone(sp).(*sandboxv1.SandboxSpec)
		gsp.RuntimeClass = local.GVisorClass
		gid := g.create(t, gsp, "").GetSandboxId()
		g.waitState(t, gid, sandboxv1.State_STATE_RUNNING)
		grun := func(script string) string {
			t.Helper()
			ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: gid, Container: "side", Command: []string{"sh", "-c", script}}))
			if err != nil {
				t.Fatalf("exec in the gVisor sidecar: %v", err)
			}
			out := string(ex.Msg.GetStdout()) + string(ex.Msg.GetStderr())
			if strings.Contains(out, value) {
				t.Fatalf("gVisor sidecar: the output holds the value:\n%s", out)
			}
			return out
		}
		gph := placeholderOf(grun("env"))
		if !strings.HasPrefix(gph, "sbx-secret-") || gph == ph {
			t.Errorf("gVisor sidecar: placeholder %q (want a fresh one)", gph)
		}
		curlG := `curl -sS --max-time 20 -H "Authorization: Bearer $API_TOKEN" https://%s/echo 2>&1`
		if got := grun(fmt.Sprintf(curlG, "api.inject.test")); !strings.Contains(got, "authorization="+realHash) {
			t.Errorf("gVisor: curl to api.inject.test: %q, want the real value's hash", got)
		}
		if got := grun(fmt.Sprintf(curlG, "other.inject.test")); !strings.Contains(got, "authorization="+egresstest.EchoHash("Bearer "+gph)) {
			t.Errorf("gVisor: curl to other.inject.test: %q, want the placeholder's hash", got)
		}
		gvisorUses = 1
		t.Log("gVisor group: curl in the sidecar injected and spliced as under runc")
	} else {
		t.Log("no runsc: the gVisor group is not tried")
	}

	// The audit log names the uses, never the value; nothing on disk or in the logs.
	audit, err := os.ReadFile(filepath.Join(stackDir, "network", network.AuditFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(audit), value) || strings.Count(string(audit), `"result":"injected"`) < 3+n+gvisorUses {
		t.Errorf("audit log:\n%s", audit)
	}
	if hits := grepTree(t, dir, value); len(hits) > 0 {
		t.Errorf("the value is in files: %v", hits)
	}
	if strings.Contains(logs.String(), value) {
		t.Error("the value is in the logs")
	}
}
