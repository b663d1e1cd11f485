package e2e

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestTemplateWarmPoolRegistryImage: a template whose image is in the platform registry
// (pushed with a push token, as an image build does) with sandboxd.warmPool {size: 1}:
// the runner's pool pulls it with the pull token the gateway mints for the template's
// organization and holds a ready container before any create; CreateSandboxFromTemplate
// claims it, and exec works in the claimed sandbox.
func TestTemplateWarmPoolRegistryImage(t *testing.T) {
	dir := t.TempDir()
	srv := httptest.NewUnstartedServer(nil)
	srv.Start()
	host := strings.TrimPrefix(srv.URL, "http://")
	reg, err := registry.New(context.Background(), registry.Config{Dir: filepath.Join(dir, "registry"), Auth: noKeys{},
		TokenKey: []byte(strings.Repeat("w", 32)), Host: host})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = reg
	t.Cleanup(func() { srv.Close(); reg.Close() })
	const org = "warm-org" // templateGateway's organization
	imgs, err := testimage.StandardImages()
	if err != nil {
		t.Fatal(err)
	}
	push, err := reg.MintPushToken(org, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ref := host + "/" + org + "/bb:v1"
	if _, err := testimage.PushAuth(host, org+"/bb:v1", imgs.Busybox, &image.Credentials{Username: "build", Password: push}); err != nil {
		t.Fatal(err)
	}

	cfg := env.StackConfig(filepath.Join(dir, "stack"))
	cfg.InsecureRegistries = append(cfg.InsecureRegistries, host)
	cfg.Pool = local.PoolConfig{Idle: time.Second, MaxTargeted: local.DefaultMaxTargeted} // no pool for plain creates
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { finish(t, s, cfg.DataDir) })
	g := templateGateway(t, s, func(c *gateway.Config) { c.RegistryCredentials = reg.PullCredentials })
	admin := auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "admin", Org: org, Role: auth.RoleAdmin})
	user := auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "user", Org: org, Role: auth.RoleUser})

	tmpl := &sandboxv1.SandboxTemplate{DisplayName: "warm-built", Spec: &sandboxv1.PartialSandboxSpec{
		Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: ref, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}}},
	}, Attachments: &structpb.Struct{Fields: map[string]*structpb.Value{
		gateway.WarmPoolAttachment: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"size": structpb.NewNumberValue(1)}}),
	}}}
	created, err := g.CreateSandboxTemplate(admin, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: tmpl}))
	if err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, s, 1)
	if st := s.Backend.PoolStats(); st.Targeted != 1 || st.Claims != 0 || len(s.Runner.List()) != 0 {
		t.Fatalf("before any create: pool %+v, %d sandboxes", st, len(s.Runner.List()))
	}

	res, err := g.CreateSandboxFromTemplate(user, connect.NewRequest(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "warm-built"}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	sb := waitState(t, s, id, runner.StateRunning, 30*time.Second)
	if st := s.Backend.PoolStats(); st.Claims != 1 {
		t.Fatalf("create from the registry template not served from the pool: %+v", st)
	}
	if sb.Spec.Image != ref || sb.Spec.PullCredentials != nil {
		t.Fatalf("sandbox spec: image %q, credentials kept %v", sb.Spec.Image, sb.Spec.PullCredentials != nil)
	}
	ex, err := agentOf(t, s, id).Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{Command: []string{"hostname"}}))
	if err != nil || string(ex.Msg.GetStdout()) != id+"\n" {
		t.Fatalf("exec in the claimed sandbox: %v %q", err, ex.Msg.GetStdout())
	}
	waitPoolReady(t, s, 1) // refilled with the resent token

	// Untarget before the stack's leak check (a standing target refills after its drain).
	if _, err := g.DeleteSandboxTemplate(admin, connect.NewRequest(&sandboxv1.DeleteSandboxTemplateRequest{SandboxTemplateId: created.Msg.GetSandboxTemplateId()})); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for st := s.Backend.PoolStats(); st.Ready > 0 || st.Targeted > 0; st = s.Backend.PoolStats() {
		if time.Now().After(deadline) {
			t.Fatalf("pool after the template's delete: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
