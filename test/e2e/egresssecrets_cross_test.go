package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// TestEgressSecretCross (docs/secrets.md, "Forks and moves"): a gVisor sandbox with an
// egress secret on runner r1 is forked onto runner r2 and then moved there (paused
// releasing its resources, resumed on r2), its checkpoint through the shared bucket and
// its egress CA and placeholders over the runner wire. After each, the copy on r2 keeps
// the source's placeholder (its processes are the source's), trusts the same CA, and its
// requests to the injection host carry the value as the store has it now (resolved
// again by the gateway); another host gets the placeholder; its environment and the
// calling process's memory hold no value.
func TestEgressSecretCross(t *testing.T) {
	needRunsc(t)
	const value, forkValue, moveValue = "e2e-cross-token-1-5e0a", "e2e-cross-token-2-c3b7", "e2e-cross-token-3-91fd"
	in := egresstest.New(t)
	apiIP, otherIP := in.Addr(t), in.Addr(t)
	in.SetA("api.inject.test", apiIP)
	in.SetA("other.inject.test", otherIP)
	in.ServeHTTPS(t, apiIP, "api.inject.test")
	in.ServeHTTPS(t, otherIP, "other.inject.test")
	caFile := filepath.Join(t.TempDir(), "internet-ca.pem")
	if err := os.WriteFile(caFile, in.CA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	ring, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	c := startCrossWith(t, func(cfg *stack.Config) {
		cfg.NoEgress = false
		cfg.Nameservers = []string{in.DNS.String()}
		cfg.EgressUpstreamCAFile = caFile // the proxies verify api.inject.test against it
		cfg.EgressRootsFile = caFile      // and the sandboxes trust it for other hosts
	}, func(e *fssS3, gc *gateway.Config) {
		gc.Secrets = gateway.SecretOptions{Store: e.st.SecretStores(), Keys: ring}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	adminKey, _, err := c.e.keys.Create("org-a", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	hc := h2cClient()
	adminOpts := []connect.ClientOption{connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(adminKey))}
	settings := sandboxv1connect.NewSettingsServiceClient(hc, c.g.url, adminOpts...)
	secrets := settingsv1connect.NewSecretServiceClient(hc, c.g.url, adminOpts...)
	if _, err := settings.CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "prod"}})); err != nil {
		t.Fatal(err)
	}
	put := func(v string) {
		t.Helper()
		if _, err := secrets.PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "prod", Path: "api", Field: "token", Value: v})); err != nil {
			t.Fatal(err)
		}
	}
	put(value)

	sp := spec(env.Python(), "/bin/sh", "-c", `trap "exit 0" TERM; sleep infinity & wait`)
	sp.RuntimeClass = local.GVisorClass
	sp.RunnerIds = []string{"r1"}
	sp.Containers[0].Resources = &sandboxv1.Resources{Cpu: "1", Memory: "256Mi"}
	sp.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
		{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "api.inject.test"},
			SandboxdSecret: &sandboxv1.EgressSecretInjection{StoreName: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}},
		{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "other.inject.test"}},
	}}
	src := c.g.create(t, sp, "").GetSandboxId()
	var made []string
	t.Cleanup(func() { c.del(t, append(made, src)...) })
	c.g.waitState(t, src, sandboxv1.State_STATE_RUNNING)

	type probeOut struct {
		Placeholder string         `json:"placeholder"`
		API         string         `json:"api.inject.test"`
		Other       string         `json:"other.inject.test"`
		Memory      map[string]any `json:"memory"`
	}
	probe := func(id, v string) probeOut {
		t.Helper()
		sum := sha256.Sum256([]byte(v))
		args := []string{"python3", "-c", egressSecretProbe, hex.EncodeToString([]byte(v[:8])), hex.EncodeToString(sum[:]), strconv.Itoa(len(v))}
		ex, err := c.g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: args}))
		if err != nil {
			t.Fatal(err)
		}
		stdout := string(ex.Msg.GetStdout())
		for _, x := range []string{value, forkValue, moveValue} {
			if strings.Contains(stdout, x) {
				t.Fatalf("the probe's output holds a value:\n%s", stdout)
			}
		}
		var out probeOut
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
			t.Fatalf("probe output %q (stderr %q): %v", stdout, ex.Msg.GetStderr(), err)
		}
		t.Logf("probe %s: %+v", id, out)
		return out
	}
	// check: id, on runner r, injects v under the source's placeholder, and holds no value.
	check := func(what, id, r, placeholder, v string) {
		t.Helper()
		if st := c.status(t, id); st.GetState() != sandboxv1.State_STATE_RUNNING || st.GetRunnerId() != r {
			t.Errorf("%s: %s on %q, want RUNNING on %s", what, st.GetState(), st.GetRunnerId(), r)
		}
		got := probe(id, v)
		if got.Placeholder != placeholder {
			t.Errorf("%s: placeholder %q, the source's %q (its processes are the source's)", what, got.Placeholder, placeholder)
		}
		if want := "authorization=" + egresstest.EchoHash("Bearer "+v); !strings.Contains(got.API, want) {
			t.Errorf("%s: api.inject.test saw %q, want %s (the value now)", what, got.API, want)
		}
		if want := "authorization=" + egresstest.EchoHash("Bearer "+placeholder); !strings.Contains(got.Other, want) {
			t.Errorf("%s: other.inject.test saw %q, want the placeholder", what, got.Other)
		}
		if got.Memory["value"] != false || got.Memory["placeholder"] != true {
			t.Errorf("%s: memory of the calling process: %v", what, got.Memory)
		}
		envx, err := c.g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", "env; cat /proc/1/environ; cat /etc/sandboxd-egress/ca.pem"}}))
		if err != nil {
			t.Fatal(err)
		}
		out := string(envx.Msg.GetStdout())
		if strings.Contains(out, value) || strings.Contains(out, forkValue) || strings.Contains(out, moveValue) || strings.Contains(out, "PRIVATE KEY") ||
			!strings.Contains(out, "API_TOKEN="+placeholder) {
			t.Errorf("%s: environment or CA mount:\n%s", what, out)
		}
	}
	before := probe(src, value)
	if want := "authorization=" + egresstest.EchoHash("Bearer "+value); !strings.Contains(before.API, want) {
		t.Fatalf("source: api.inject.test saw %q, want the value", before.API)
	}
	caOf := func(id string) string {
		t.Helper()
		ex, err := c.g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"cat", "/etc/sandboxd-egress/ca.pem"}}))
		if err != nil {
			t.Fatal(err)
		}
		return string(ex.Msg.GetStdout())
	}
	srcCA := caOf(src)
	if !strings.Contains(srcCA, "BEGIN CERTIFICATE") {
		t.Fatalf("source ca.pem %q", srcCA)
	}

	// A fork onto r2 after the value changed in the store.
	put(forkValue)
	res, err := c.state.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: src, Count: 1, RunnerIds: []string{"r2"}}))
	if err != nil {
		t.Fatalf("fork onto r2: %v", err)
	}
	if fs := res.Msg.GetForks(); len(fs) != 1 || fs[0].GetError() != nil || fs[0].GetRunnerId() != "r2" {
		t.Fatalf("fork onto r2: %v", res.Msg)
	}
	fork := res.Msg.GetForks()[0].GetSandboxId()
	made = append(made, fork)
	c.g.waitState(t, fork, sandboxv1.State_STATE_RUNNING)
	check("fork on r2", fork, "r2", before.Placeholder, forkValue)
	if got := caOf(fork); got != srcCA {
		t.Errorf("the fork's ca.pem is not its source's")
	}
	// The source still injects (on r1, its value as resolved at its create).
	check("source after the fork", src, "r1", before.Placeholder, value)

	// A move to r2 after another change: paused releasing resources, resumed there.
	put(moveValue)
	c.pause(t, src)
	mv, err := c.resume(src, "r2")
	if err != nil {
		t.Fatalf("resume on r2: %v", err)
	}
	if mv.GetRunnerId() != "r2" || mv.GetMovedFrom() != "r1" {
		t.Fatalf("resume on r2 answered %v", mv)
	}
	check("moved to r2", src, "r2", before.Placeholder, moveValue)
	if got := caOf(src); got != srcCA {
		t.Errorf("the moved sandbox's ca.pem is not its own as before")
	}
	// The fork, on the same runner, keeps its own value.
	check("fork after the move", fork, "r2", before.Placeholder, forkValue)
	c.noCheckpointObjects(t, "after the fork and the move")
}
