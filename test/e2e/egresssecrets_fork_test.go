package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
)

// TestEgressSecretFork (docs/secrets.md, "Forks and moves"): a gVisor sandbox with an
// egress secret is forked on its runner after the secret's value was changed in the
// store. The fork's processes (restored from the source's memory) keep the source's
// placeholder, and the fork's requests to the injection host carry the value as it is
// now (resolved again for the fork, as a create resolves it); another host gets the
// placeholder; the fork's environment and memory hold no value; the source keeps
// injecting its own value; the value is in no file of the data dirs and no log.
func TestEgressSecretFork(t *testing.T) {
	needRunsc(t)
	const value, newValue = "e2e-fork-token-1-7b3c", "e2e-fork-token-2-a9d4"
	in := egresstest.New(t)
	apiIP, otherIP := in.Addr(t), in.Addr(t)
	in.SetA("api.inject.test", apiIP)
	in.SetA("other.inject.test", otherIP)
	in.ServeHTTPS(t, apiIP, "api.inject.test")
	in.ServeHTTPS(t, otherIP, "other.inject.test")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pol := &policies{}
	pol.set(`{` + gvisorPolicy + `}`)
	var adminKey string
	e := startEgressSecretEnv(ctx, t, in, value, func(c *gateway.Config) {
		c.Policies = pol
		adminKey, _, _ = c.Auth.(*auth.Keyring).Create("org-a", auth.RoleAdmin, "")
	})
	dir, s, cfg, g, logs := e.dir, e.s, e.cfg, e.g, e.logs
	t.Cleanup(func() { finish(t, s, cfg.DataDir) })

	sp := spec(env.Python(), "/bin/sh", "-c", `trap "exit 0" TERM; sleep infinity & wait`)
	sp.RuntimeClass = local.GVisorClass
	sp.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{
		{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "api.inject.test"},
			SandboxdSecret: &sandboxv1.EgressSecretInjection{StoreName: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}},
		{Destination: &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: "other.inject.test"}},
	}}
	src := g.create(t, sp, "").GetSandboxId()
	g.waitState(t, src, sandboxv1.State_STATE_RUNNING)

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
		ex, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: args}))
		if err != nil {
			t.Fatal(err)
		}
		stdout := string(ex.Msg.GetStdout())
		if strings.Contains(stdout, value) || strings.Contains(stdout, newValue) {
			t.Fatalf("the probe's output holds a value:\n%s", stdout)
		}
		var out probeOut
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
			t.Fatalf("probe output %q (stderr %q): %v", stdout, ex.Msg.GetStderr(), err)
		}
		t.Logf("probe %s: %+v", id, out)
		return out
	}
	before := probe(src, value)
	if want := "authorization=" + egresstest.EchoHash("Bearer "+value); !strings.Contains(before.API, want) {
		t.Fatalf("source: api.inject.test saw %q, want the value", before.API)
	}

	// The value changes in the store; then the fork.
	hc := h2cClient()
	adminOpts := []connect.ClientOption{connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(adminKey))}
	secrets := settingsv1connect.NewSecretServiceClient(hc, g.url, adminOpts...)
	if _, err := secrets.PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: "prod", Path: "api", Field: "token", Value: newValue})); err != nil {
		t.Fatal(err)
	}
	state := statev1connect.NewSandboxStateServiceClient(hc, g.url, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(g.keyA)))
	res, err := state.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: src, Count: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Msg.GetForks()) != 1 || res.Msg.GetForks()[0].GetError() != nil {
		t.Fatalf("fork: %v", res.Msg)
	}
	fork := res.Msg.GetForks()[0].GetSandboxId()
	g.waitState(t, fork, sandboxv1.State_STATE_RUNNING)

	after := probe(fork, newValue)
	if after.Placeholder != before.Placeholder {
		t.Errorf("the fork's placeholder %q, the source's %q (its processes are the source's)", after.Placeholder, before.Placeholder)
	}
	if want := "authorization=" + egresstest.EchoHash("Bearer "+newValue); !strings.Contains(after.API, want) {
		t.Errorf("fork: api.inject.test saw %q, want %s (the value now)", after.API, want)
	}
	if want := "authorization=" + egresstest.EchoHash("Bearer "+after.Placeholder); !strings.Contains(after.Other, want) {
		t.Errorf("fork: other.inject.test saw %q, want the placeholder", after.Other)
	}
	if after.Memory["value"] != false || after.Memory["placeholder"] != true {
		t.Errorf("fork: memory of the calling process: %v", after.Memory)
	}
	envx, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: fork, Command: []string{"sh", "-c", "env; cat /proc/1/environ"}}))
	if err != nil {
		t.Fatal(err)
	}
	if out := string(envx.Msg.GetStdout()); strings.Contains(out, value) || strings.Contains(out, newValue) || !strings.Contains(out, "API_TOKEN="+after.Placeholder) {
		t.Errorf("fork environment:\n%s", out)
	}
	// The source still injects the value it was created with.
	if again := probe(src, value); !strings.Contains(again.API, "authorization="+egresstest.EchoHash("Bearer "+value)) {
		t.Errorf("source after the fork: api.inject.test saw %q", again.API)
	}
	if hits := grepTree(t, dir, value, newValue); len(hits) > 0 {
		t.Errorf("files holding a value: %v", hits)
	}
	if l := logs.String(); strings.Contains(l, value) || strings.Contains(l, newValue) {
		t.Error("the logs hold a value")
	}
}
