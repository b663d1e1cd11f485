package gateway

import (
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/secretbox"
)

// TestKubernetesSecretStorePlacement: a sandbox referencing a KUBERNETES secret store is
// placed only on a runner that reads Kubernetes Secrets (a Kubernetes runner, no
// Support.NoSecretRefs); with none among the runners considered it is refused as
// FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER naming the constraint and the
// reference's store_name field per runner. A built-in store's references go anywhere.
func TestKubernetesSecretStorePlacement(t *testing.T) {
	st := openFSSStore(t)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	ring, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	local1 := &acceptingRunner{id: "local1", noSecretRefs: true}
	local2 := &acceptingRunner{id: "local2", noSecretRefs: true}
	kube := &acceptingRunner{id: "kube"}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{local1, local2, kube}, Logger: quietLog(),
		Secrets: SecretOptions{Store: st.SecretStores(), Keys: ring}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	admin, user := secretCtx("acme", auth.RoleAdmin), secretCtx("acme", auth.RoleUser)
	kt := sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_KUBERNETES
	if _, err := s.CreateSecretStore(admin, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{SecretStore: &sandboxv1.SecretStore{Name: "kube", ProviderType: kt}})); err != nil {
		t.Fatal(err)
	}
	mkStore(t, s, "acme", "prod")
	putSecret(t, s, "acme", "prod", "db", "password", "s3cret")
	create := func(pins []string, cs ...*sandboxv1.Container) (*sandboxv1.Sandbox, error) {
		res, err := s.CreateSandbox(user, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{Containers: cs, RunnerIds: pins}}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	ref := func(store, env string) []*sandboxv1.SecretStoreReference {
		return []*sandboxv1.SecretStoreReference{{StoreName: store, Secrets: []*sandboxv1.SecretMapping{{Path: "db", Field: "password", EnvVar: env}}}}
	}
	// Several creates: every one with a KUBERNETES reference lands on the Kubernetes runner.
	for range 6 {
		sb, err := create(nil, &sandboxv1.Container{Image: "busybox", SecretStores: ref("kube", "DB")})
		if err != nil {
			t.Fatal(err)
		}
		if sb.GetStatus().GetRunnerId() != "kube" {
			if sb.GetStatus().GetRunnerId() == "" {
				t.Fatalf("no runner id in the status: %v", sb.GetStatus())
			}
			t.Fatalf("placed on %s", sb.GetStatus().GetRunnerId())
		}
	}
	// A built-in store's reference: a local runner may take it.
	placed := map[string]bool{}
	for range 12 {
		sb, err := create(nil, &sandboxv1.Container{Image: "busybox", SecretStores: ref("prod", "DB")})
		if err != nil {
			t.Fatal(err)
		}
		placed[sb.GetStatus().GetRunnerId()] = true
	}
	if !placed["local1"] && !placed["local2"] {
		t.Errorf("built-in store references placed only on %v", placed)
	}
	// Pinned to local runners only: refused, naming the constraint and the field.
	_, err = create([]string{"local1", "local2"}, &sandboxv1.Container{Image: "busybox", SecretStores: ref("kube", "DB")})
	wantSecretErr(t, "KUBERNETES store on local runners", err, connect.CodeFailedPrecondition, apierr.NoSuitableRunner)
	fields := map[string]bool{}
	for _, v := range apierr.Violations(err) {
		fields[v.Field] = true
		if !strings.Contains(v.Description, placement.ConstraintSecretRefs) {
			t.Errorf("violation %+v does not name %s", v, placement.ConstraintSecretRefs)
		}
	}
	for _, id := range []string{"local1", "local2"} {
		if f := "runner[" + id + "].sandbox.spec.containers[0].secret_stores[0].store_name"; !fields[f] {
			t.Errorf("no violation of %s in %v", f, fields)
		}
	}
	// One local runner pinned: the same refusal (not the policy's INVALID_ARGUMENT).
	_, err = create([]string{"local1"}, &sandboxv1.Container{Name: "main", Image: "busybox", SecretStores: ref("prod", "A")},
		&sandboxv1.Container{Name: "side", Image: "busybox", SecretStores: ref("kube", "B")})
	wantSecretErr(t, "KUBERNETES store on one local runner", err, connect.CodeFailedPrecondition, apierr.NoSuitableRunner)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "runner[local1].sandbox.spec.containers[1].secret_stores[0].store_name" {
		t.Errorf("violations %+v", vs)
	}
}
