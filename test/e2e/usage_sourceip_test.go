package e2e

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
)

// TestResourceUsage: GetSandbox of a busy running sandbox reports status.resource_usage
// read from its cgroup: CPU near the one core it spins (well above zero) and the memory
// it holds; an idle one reports little CPU.
func TestResourceUsage(t *testing.T) {
	g := startGateway(t)
	// One core spinning, and ~48 MiB held in a tmpfs-free way: a shell variable.
	busy := g.create(t, spec(busybox(), "/bin/sh", "-c",
		`trap "exit 0" TERM; (while :; do :; done) & x=$(head -c 50000000 /dev/zero | tr '\0' a); sleep infinity & wait`), "")
	g.waitState(t, busy.SandboxId, sandboxv1.State_STATE_RUNNING)
	var u *sandboxv1.ResourceUsage
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(1100 * time.Millisecond) {
		res, err := g.sandboxes.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: busy.SandboxId}))
		if err != nil {
			t.Fatal(err)
		}
		u = res.Msg.GetStatus().GetResourceUsage()
		t.Logf("resource_usage %v", u)
		if u.GetCpuMillicores() >= 100 && u.GetMemoryMb() >= 40 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("busy sandbox: resource_usage %v, want ≥ 100m CPU and ≥ 40 MiB", u)
		}
	}
	if u.GetCpuMillicores() > 1500 { // limited to 1 CPU by default
		t.Errorf("busy sandbox on 1 CPU reports %dm", u.GetCpuMillicores())
	}

	idle := g.create(t, sleeperSpec(), "")
	g.waitState(t, idle.SandboxId, sandboxv1.State_STATE_RUNNING)
	time.Sleep(1100 * time.Millisecond)
	res, err := g.sandboxes.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: idle.SandboxId}))
	if err != nil {
		t.Fatal(err)
	}
	if u := res.Msg.GetStatus().GetResourceUsage(); u == nil || u.GetCpuMillicores() > 200 || u.GetMemoryMb() <= 0 {
		t.Errorf("idle sandbox: resource_usage %v, want little CPU and some memory", u)
	}
	// Ended: no usage.
	if _, err := g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: idle.SandboxId})); err != nil {
		t.Fatal(err)
	}
	ended := g.waitState(t, idle.SandboxId, sandboxv1.State_STATE_TERMINATED)
	if u := ended.GetStatus().GetResourceUsage(); u != nil {
		t.Errorf("ended sandbox: resource_usage %v", u)
	}
}

// staticPolicyDoc is one policy document for every runner.
type staticPolicyDoc string

func (p staticPolicyDoc) Policy(context.Context, string) ([]byte, int64, error) {
	return []byte(p), 1, nil
}

// TestSourceIPAllowlistE2E: a runner whose policy allows Sandbox API calls from
// 127.0.0.1 only, behind a gateway that trusts the proxy 127.0.0.2: a real sandbox
// created from 127.0.0.1 runs commands for 127.0.0.1 and for callers the trusted proxy
// forwards from 127.0.0.1; a direct caller from 127.0.0.3, with or without a forged
// X-Forwarded-For, gets PERMISSION_DENIED naming its address.
func TestSourceIPAllowlistE2E(t *testing.T) {
	trusted, _ := gateway.ParseTrustedProxies("127.0.0.2")
	g := startGateway(t, func(c *gateway.Config) {
		c.Policies = staticPolicyDoc(`{"control_plane_access": {"source_ip_allowlist": ["127.0.0.1"]}}`)
		c.TrustedProxies = trusted
	})
	from := func(src, xff string) sandboxv1connect.SandboxServiceClient {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		hc := &http.Client{Transport: &http.Transport{Protocols: p, DialContext: d.DialContext}}
		return sandboxv1connect.NewSandboxServiceClient(hc, g.url, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(g.keyA),
			connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
				return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
					if xff != "" {
						req.Header().Set("X-Forwarded-For", xff)
					}
					return next(ctx, req)
				}
			})))
	}
	sb := g.create(t, sleeperSpec(), "") // from 127.0.0.1
	g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING)
	execIn := func(c sandboxv1connect.SandboxServiceClient) (string, error) {
		res, err := c.Exec(context.Background(), connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"echo", "ok"}}))
		if err != nil {
			return "", err
		}
		return string(res.Msg.GetStdout()), nil
	}
	for name, c := range map[string]sandboxv1connect.SandboxServiceClient{
		"127.0.0.1": g.sandboxes, "proxy for 127.0.0.1": from("127.0.0.2", "127.0.0.1"),
	} {
		if out, err := execIn(c); err != nil || strings.TrimSpace(out) != "ok" {
			t.Errorf("exec from %s: %q %v", name, out, err)
		}
	}
	for name, c := range map[string]sandboxv1connect.SandboxServiceClient{
		"127.0.0.3": from("127.0.0.3", ""), "127.0.0.3 forging X-Forwarded-For": from("127.0.0.3", "127.0.0.1"),
	} {
		_, err := execIn(c)
		if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.SourceIPNotAllowed || !strings.Contains(err.Error(), "127.0.0.3") {
			t.Errorf("exec from %s: %v, want PERMISSION_DENIED %s naming 127.0.0.3", name, err, apierr.SourceIPNotAllowed)
		}
		_, err = c.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}}))
		if apierr.Reason(err) != apierr.SourceIPNotAllowed {
			t.Errorf("create from %s: %v", name, err)
		}
	}
}
