package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestTemplateWarmPool: a template with sandboxd.warmPool {size: 2} makes the runner's
// pool hold 2 ready containers of its image without any create (the image is pulled
// then), and CreateSandboxFromTemplate is served from them; deleting the template
// releases them to the idle rules.
func TestTemplateWarmPool(t *testing.T) {
	dir := t.TempDir()
	cfg := env.StackConfig(dir)
	cfg.Pool = local.PoolConfig{Idle: time.Second, MaxTargeted: local.DefaultMaxTargeted} // no pool for plain creates
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { finish(t, s, dir) }) // deletes the sandboxes, drains the pool, checks for leaks
	g := templateGateway(t, s)
	const org = "warm-org"
	admin := auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "admin", Org: org, Role: auth.RoleAdmin})
	user := auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "user", Org: org, Role: auth.RoleUser})

	tmpl := &sandboxv1.SandboxTemplate{DisplayName: "warm-busybox", Spec: &sandboxv1.PartialSandboxSpec{
		Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}}},
	}, Attachments: &structpb.Struct{Fields: map[string]*structpb.Value{
		gateway.WarmPoolAttachment: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"size": structpb.NewNumberValue(2)}}),
	}}}
	created, err := g.CreateSandboxTemplate(admin, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: tmpl}))
	if err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, s, 2)
	if st := s.Backend.PoolStats(); st.Targeted != 2 || st.Claims != 0 || len(s.Runner.List()) != 0 {
		t.Fatalf("before any create: pool %+v, %d sandboxes", st, len(s.Runner.List()))
	}
	time.Sleep(2 * time.Second) // past Idle: a targeted set stays
	if st := s.Backend.PoolStats(); st.Ready != 2 {
		t.Fatalf("targeted pool expired: %+v", st)
	}

	res, err := g.CreateSandboxFromTemplate(user, connect.NewRequest(&sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: "warm-busybox"}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	sb := waitState(t, s, id, runner.StateRunning, 30*time.Second)
	if st := s.Backend.PoolStats(); st.Claims != 1 {
		t.Fatalf("create from the template not served from the pool: %+v", st)
	}
	if sb.Spec.Image != busybox() || sb.Spec.Container.Command != "/bin/sh" {
		t.Fatalf("sandbox %+v", sb)
	}
	ex, err := agentOf(t, s, id).Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{Command: []string{"hostname"}}))
	if err != nil || string(ex.Msg.GetStdout()) != id+"\n" {
		t.Fatalf("exec in the claimed sandbox: %v %q", err, ex.Msg.GetStdout())
	}
	waitPoolReady(t, s, 2) // refilled to the target

	// Deleted template: untargeted, dropped after Idle.
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

// templateGateway is a gateway over s's runner with templates in a SQLite store.
func templateGateway(t *testing.T, s *stack.Stack, opts ...func(*gateway.Config)) *gateway.Server {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: "warm-org", Name: "warm-org"}); err != nil {
		t.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	gcfg := gateway.Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("local", s.Runner)},
		Index: st.Sandboxes(), Orgs: st.Orgs(), Templates: st.Templates()}
	for _, o := range opts {
		o(&gcfg)
	}
	g, err := gateway.New(gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}
