package gateway

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestForkAndMoveKeepSecretRefConstraint: a sandbox whose containers reference a
// KUBERNETES secret store forks and moves only to runners that read Kubernetes Secrets,
// as its create was placed (placement.ConstraintSecretRefs): a move's targets leave out a
// runner that cannot (refused naming the constraint and the reference's store_name
// field), and a fork on a source runner that cannot is refused the same way, rather than
// sent to a runner that then refuses it. A sandbox without such references is placed as
// before.
func TestForkAndMoveKeepSecretRefConstraint(t *testing.T) {
	platform := "gvisor runsc-1 linux/amd64"
	r1, local, kube := newPortRunner("r1", platform), newPortRunner("local", platform), newPortRunner("kube", platform)
	local.noSecretRefs = true
	e := newPauseEnv(t, "", r1, local, kube)
	id := e.createOn(t, r1)
	ctx := secretCtx("acme", auth.RoleUser)
	e.s.views.probe(ctx)
	rec, _, err := e.s.lookup(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	src, err := r1.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Without references: every runner with the platform is a target.
	targets, refused := e.s.checkpointTargets(ctx, rec, r1, src, nil)
	if len(targets) != 2 || len(refused) != 0 {
		t.Fatalf("plain: targets %d, refused %+v", len(targets), refused)
	}

	// The same sandbox with a KUBERNETES reference in its second secret_stores entry.
	withRefs := *rec
	withRefs.spec = proto.CloneOf(rec.spec)
	withRefs.spec.Containers[0].SecretStores = []*sandboxv1.SecretStoreReference{
		{StoreName: "prod", Secrets: []*sandboxv1.SecretMapping{{Path: "db", EnvVar: "A"}}},
		{StoreName: "kube", Secrets: []*sandboxv1.SecretMapping{{Path: "db", Field: "pw", EnvVar: "B"}}},
	}
	src.Spec = src.Spec.Clone()
	src.Spec.Container.SecretRefs = []runtime.SecretRef{{EnvVar: "B", Store: "kube", Secret: "db", Key: "pw"}}
	field := "sandbox.spec.containers[0].secret_stores[1].store_name"
	if got := secretRefFieldsOf(&withRefs, src); !slices.Equal(got, []string{field}) {
		t.Fatalf("fields = %v", got)
	}
	targets, refused = e.s.checkpointTargets(ctx, &withRefs, r1, src, nil)
	if len(targets) != 1 || targets[0].c.RunnerID != "kube" {
		t.Fatalf("targets = %+v (refused %+v)", targets, refused)
	}
	if len(refused) != 1 || refused[0].runner != "local" || refused[0].kind != refusedNever ||
		!strings.Contains(refused[0].why, placement.ConstraintSecretRefs) || !strings.Contains(refused[0].why, field) {
		t.Fatalf("refused = %+v", refused)
	}
	// A fork on the runner that cannot read them: refused naming the constraint.
	_, err = e.s.placeFork(ctx, &withRefs, local, src)
	if apierr.Reason(err) != apierr.NoSuitableRunner || !strings.Contains(err.Error(), placement.ConstraintSecretRefs) {
		t.Fatalf("fork on a runner without secret refs = %v", err)
	}
	if _, err := e.s.placeFork(ctx, &withRefs, kube, src); err != nil {
		t.Fatalf("fork on the Kubernetes runner = %v", err)
	}
}
