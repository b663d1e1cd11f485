package gateway

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/secretbox"
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

// TestForkEgressSecrets: a fork of a sandbox with egress secrets is given their values,
// resolved again in the organization (the value now, not the source's), in its runner's
// ForkTarget; it is made on the source's runner only: a fork that runner_ids sends
// elsewhere, and a move of the sandbox checkpointed, are refused naming the egress
// secrets (FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED), never made without
// them. A secret deleted since the create refuses the fork with its reason.
func TestForkEgressSecrets(t *testing.T) {
	platform := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", platform), newPortRunner("r2", platform)
	e := newPauseEnv(t, "", r1, r2)
	ring, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	e.s.secrets.Store, e.s.secrets.Keys = e.st.SecretStores(), ring
	mkStore(t, e.s, "acme", "prod")
	putSecret(t, e.s, "acme", "prod", "api", "token", "value-at-fork")
	id := e.createOn(t, r1)
	apiRule := runtime.EgressRule{DNSName: "api.example.com",
		Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}
	setEgressSecrets(t, e, r1, id, []runtime.EgressRule{apiRule}, []runtime.EgressRule{apiRule})
	ctx := t.Context()
	e.s.views.probe(ctx)
	res, err := e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id}))
	if err != nil || len(res.Msg.GetForks()) != 1 || res.Msg.GetForks()[0].GetError() != nil {
		t.Fatalf("fork = %v, %v", res, err)
	}
	r1.mu.Lock()
	targets := r1.forks[len(r1.forks)-1]
	r1.mu.Unlock()
	if len(targets) != 1 || targets[0].EgressSecretValues["prod/api#token"] != "value-at-fork" {
		t.Fatalf("fork targets %+v", targets)
	}
	// runner_ids elsewhere: the fork is imported on r2 from r1's export, which carries
	// the egress CA and placeholders (the ref's Egress, over the runner wire) to r2 as
	// they are, with the values resolved again for the fork.
	state := &runtime.EgressState{CACert: []byte("ca"), CAKey: []byte("key"),
		Injections: []runtime.EgressInjection{{Host: "api.example.com", Header: "Authorization", Placeholder: "sbx-secret-0123", Secret: "prod/api#token"}}}
	r1.mu.Lock()
	r1.egress = state
	r1.mu.Unlock()
	putSecret(t, e.s, "acme", "prod", "api", "token", "value-at-fork-2")
	res, err = e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, RunnerIds: []string{"r2"}}))
	if err != nil || len(res.Msg.GetForks()) != 1 || res.Msg.GetForks()[0].GetError() != nil || res.Msg.GetForks()[0].GetRunnerId() != "r2" {
		t.Fatalf("fork on another runner = %v, %v", res, err)
	}
	imported := func(n int) runner.ImportRequest {
		t.Helper()
		r2.mu.Lock()
		defer r2.mu.Unlock()
		if len(r2.imports) != n {
			t.Fatalf("%d imports on r2, want %d", len(r2.imports), n)
		}
		return r2.imports[n-1]
	}
	if req := imported(1); req.Ref.Egress != state || req.Move || len(req.Targets) != 1 || req.Targets[0].EgressSecretValues["prod/api#token"] != "value-at-fork-2" {
		t.Fatalf("import on r2: egress %v, move %v, targets %+v", req.Ref.Egress, req.Move, req.Targets)
	}
	// A move: the same, to the same ID; it then runs on r2.
	e.pause(t, id, true)
	putSecret(t, e.s, "acme", "prod", "api", "token", "value-at-move")
	if _, err = e.resume(t, id, "r2"); err != nil {
		t.Fatalf("move = %v", err)
	}
	if req := imported(2); req.Ref.Egress != state || !req.Move || len(req.Targets) != 1 || req.Targets[0].ID != id || req.Targets[0].EgressSecretValues["prod/api#token"] != "value-at-move" {
		t.Fatalf("move import on r2: egress %v, move %v, targets %+v", req.Ref.Egress, req.Move, req.Targets)
	}
	if e.storedRunner(t, id) != "r2" {
		t.Fatalf("moved sandbox on %s", e.storedRunner(t, id))
	}
	r2.mu.Lock()
	r2.egress = state
	r2.mu.Unlock()
	setEgressSecrets(t, e, r2, id, []runtime.EgressRule{apiRule}, []runtime.EgressRule{apiRule})
	r1 = r2 // the source's runner from now on
	// The secret gone: the fork is refused with its reason, nothing asked of the runner.
	if _, err := (secretService{e.s}).DeleteSecret(secretCtx("acme", auth.RoleAdmin), connect.NewRequest(&settingsv1.DeleteSecretRequest{StoreName: "prod", Path: "api", Field: "token"})); err != nil {
		t.Fatal(err)
	}
	r1.mu.Lock()
	n := len(r1.forks)
	r1.mu.Unlock()
	_, err = e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id}))
	if apierr.Reason(err) != apierr.SecretNotProvisioned {
		t.Fatalf("fork after the secret was deleted = %v", err)
	}
	r1.mu.Lock()
	defer r1.mu.Unlock()
	if len(r1.forks) != n {
		t.Fatal("the runner was asked to fork without the values")
	}
}

// setEgressSecrets gives sandbox id egress rules with secrets: recorded in the gateway's
// record (as a create with them records them), reported by its runner r.
func setEgressSecrets(t *testing.T, e *pauseEnv, r *portRunner, id string, recorded, reported []runtime.EgressRule) {
	t.Helper()
	rec, _, err := e.s.lookup(secretCtx("acme", auth.RoleUser), id)
	if err != nil {
		t.Fatal(err)
	}
	sp := proto.CloneOf(rec.spec)
	sp.Network = &sandboxv1.NetworkOptions{}
	for _, rule := range recorded {
		sec := rule.Secret
		sp.Network.Egress = append(sp.Network.Egress, &sandboxv1.EgressRule{
			Destination:    &sandboxv1.EgressRule_HttpsHostname{HttpsHostname: rule.DNSName},
			SandboxdSecret: &sandboxv1.EgressSecretInjection{StoreName: sec.Store, Path: sec.Path, Field: sec.Field, Header: sec.Header, EnvVar: sec.EnvVar}})
	}
	e.s.index.mu.Lock()
	rec.spec = sp
	e.s.index.mu.Unlock()
	r.mu.Lock()
	sb := r.got[id]
	sb.Spec.Network = &runtime.Network{Egress: reported}
	r.got[id] = sb
	r.mu.Unlock()
}

// TestForkEgressSecretsFromTheRecord: the secrets a fork is given are those of the
// gateway's record of the sandbox (its create's sandboxd_secret references), never the
// ones its runner reports: a (compromised) runner that reports an egress rule naming
// another of the organization's secrets is never sent that secret's value (the fork is
// refused, the runner not asked); a runner that hides the recorded rules gets the
// record's values only, and so does another runner that imports its checkpoint.
func TestForkEgressSecretsFromTheRecord(t *testing.T) {
	platform := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", platform), newPortRunner("r2", platform)
	e := newPauseEnv(t, "", r1, r2)
	ring, err := secretbox.LoadOrCreate(filepath.Join(t.TempDir(), secretbox.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	e.s.secrets.Store, e.s.secrets.Keys = e.st.SecretStores(), ring
	mkStore(t, e.s, "acme", "prod")
	putSecret(t, e.s, "acme", "prod", "api", "token", "api-value")
	putSecret(t, e.s, "acme", "prod", "admin", "key", "admin-value-never-sent")
	id := e.createOn(t, r1)
	ctx := t.Context()
	e.s.views.probe(ctx)
	apiRule := runtime.EgressRule{DNSName: "api.example.com",
		Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}
	extra := runtime.EgressRule{DNSName: "attacker.example.net",
		Secret: &runtime.EgressSecret{Store: "prod", Path: "admin", Field: "key", EnvVar: "ADMIN"}}
	forks := func() int {
		r1.mu.Lock()
		defer r1.mu.Unlock()
		return len(r1.forks)
	}
	for name, reported := range map[string][]runtime.EgressRule{
		"an extra rule":     {apiRule, extra},
		"another rule only": {extra},
	} {
		setEgressSecrets(t, e, r1, id, []runtime.EgressRule{apiRule}, reported)
		n := forks()
		_, err := e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id}))
		if err == nil || !strings.Contains(err.Error(), "not created with") {
			t.Fatalf("%s: fork = %v", name, err)
		}
		if forks() != n {
			t.Fatalf("%s: the runner was asked to fork", name)
		}
	}
	// The recorded rule alone: its value only.
	setEgressSecrets(t, e, r1, id, []runtime.EgressRule{apiRule}, []runtime.EgressRule{apiRule})
	res, err := e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id}))
	if err != nil || len(res.Msg.GetForks()) != 1 || res.Msg.GetForks()[0].GetError() != nil {
		t.Fatalf("fork = %v, %v", res, err)
	}
	// The runner hides the rules: the values are still the record's, on r1 and on r2
	// (whose runner refuses values for secrets its checkpoint's spec does not have).
	setEgressSecrets(t, e, r1, id, []runtime.EgressRule{apiRule}, nil)
	if _, err := e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, RunnerIds: []string{"r2"}})); err != nil {
		t.Fatalf("fork on another runner, rules hidden = %v", err)
	}
	r2.mu.Lock()
	for _, req := range r2.imports {
		for _, tg := range req.Targets {
			if len(tg.EgressSecretValues) != 1 || tg.EgressSecretValues["prod/api#token"] != "api-value" {
				t.Errorf("import target values %v", tg.EgressSecretValues)
			}
		}
	}
	if len(r2.imports) != 1 {
		t.Errorf("%d imports asked of r2", len(r2.imports))
	}
	r2.mu.Unlock()
	if _, err := e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id})); err != nil {
		t.Fatalf("fork, rules hidden = %v", err)
	}
	r1.mu.Lock()
	defer r1.mu.Unlock()
	for _, ts := range r1.forks {
		for _, tg := range ts {
			if len(tg.EgressSecretValues) != 1 || tg.EgressSecretValues["prod/api#token"] != "api-value" {
				t.Errorf("fork target values %v", tg.EgressSecretValues)
			}
		}
	}
	if len(r1.forks) != 2 {
		t.Errorf("%d forks asked of r1", len(r1.forks))
	}
}
