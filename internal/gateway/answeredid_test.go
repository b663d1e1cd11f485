package gateway

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// namingRunner is an owned runner that answers a create under the ID it is told to (a
// warm sandbox's, or a forged one), and records what it was sent and asked to delete.
type namingRunner struct {
	*ownedRunner
	nmu     sync.Mutex
	answer  string
	anyID   []bool
	deleted []string
}

func (r *namingRunner) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	r.nmu.Lock()
	r.anyID = append(r.anyID, req.Spec.Meta[runtime.MetaAnyID] == "true")
	if r.answer != "" {
		req.Spec.ID = r.answer
	}
	r.nmu.Unlock()
	return r.ownedRunner.Create(ctx, req)
}

func (r *namingRunner) Delete(ctx context.Context, id string, d time.Duration) (runner.Sandbox, error) {
	r.nmu.Lock()
	r.deleted = append(r.deleted, id)
	r.nmu.Unlock()
	return r.ownedRunner.Delete(ctx, id, d)
}

func (r *namingRunner) set(answer string) {
	r.nmu.Lock()
	defer r.nmu.Unlock()
	r.answer, r.anyID, r.deleted = answer, nil, nil
}

// TestAnsweredIDChecked: the gateway takes a sandbox under the ID a runner answers with
// only when it asked a platform runner to choose, the ID is valid and no record has it.
// A tenant's runner is never asked, and answering under another organization's ID gets
// its create refused (and deleted there) while the victim's sandbox stays reachable;
// a platform runner answering under a known ID does not get the live one deleted.
func TestAnsweredIDChecked(t *testing.T) {
	ctx := t.Context()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{testOrg, "org-b", "platform"} {
		if _, err := st.Orgs().Create(ctx, store.Org{ID: o, Name: o}); err != nil {
			t.Fatal(err)
		}
	}
	platform := &namingRunner{ownedRunner: newOwned("platform-1", "platform", true)}
	tenant := &namingRunner{ownedRunner: newOwned("b-runner", "org-b", true)}
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{platform, tenant}, Index: st.Sandboxes(), Orgs: st.Orgs(), PlatformOrg: "platform", Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	as := func(org string) context.Context {
		return auth.WithPrincipal(ctx, auth.Principal{KeyID: "k-" + org, Org: org, Role: auth.RoleAdmin})
	}
	create := func(org string, pin string) (string, error) {
		res, err := s.CreateSandbox(as(org), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Image: "python:3.11"}}, RunnerIds: []string{pin}}}}))
		if err != nil {
			return "", err
		}
		return res.Msg.GetSandboxId(), nil
	}
	visible := func(org, id string) bool {
		_, err := s.GetSandbox(as(org), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		return err == nil
	}

	victim, err := create(testOrg, "platform-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(platform.anyID) != 1 || !platform.anyID[0] {
		t.Fatalf("a platform runner was not asked to choose the ID: %v", platform.anyID)
	}

	// A tenant's runner answers org-b's create under org-a's sandbox ID.
	tenant.set(victim)
	if id, err := create("org-b", "b-runner"); err == nil {
		t.Fatalf("a tenant runner's answer under another organization's ID was taken (%s)", id)
	}
	if len(tenant.anyID) != 1 || tenant.anyID[0] {
		t.Errorf("a tenant's runner was asked to choose the ID: %v", tenant.anyID)
	}
	if !visible(testOrg, victim) {
		t.Fatal("the victim's sandbox is not found after a tenant runner answered under its ID")
	}
	if visible("org-b", victim) {
		t.Fatal("org-b sees org-a's sandbox")
	}
	if len(tenant.deleted) != 1 || tenant.deleted[0] != victim {
		t.Errorf("the tenant runner's forged sandbox was not deleted there: %v", tenant.deleted)
	}

	// Even a tenant's own fresh ID is refused: it was not asked to choose.
	tenant.set("freshid1")
	if _, err := create("org-b", "b-runner"); err == nil {
		t.Fatal("a tenant runner chose the ID of org-b's sandbox")
	}

	// A platform runner answering under a known ID: refused, the live one kept.
	platform.set(victim)
	if _, err := create("org-b", "platform-1"); err == nil {
		t.Fatal("a platform runner's answer under a known ID was taken")
	}
	if len(platform.deleted) != 0 {
		t.Errorf("the live sandbox under the answered ID was deleted: %v", platform.deleted)
	}
	if !visible(testOrg, victim) {
		t.Fatal("the victim's sandbox is not found after a platform runner answered under its ID")
	}
	// An invalid ID: refused.
	platform.set("Bad/ID")
	if _, err := create("org-b", "platform-1"); err == nil {
		t.Fatal("an invalid answered ID was taken")
	}
	// A fresh valid ID (a warm sandbox's): taken.
	platform.set("warm1234")
	if id, err := create("org-b", "platform-1"); err != nil || id != "warm1234" || !visible("org-b", id) {
		t.Fatalf("a warm sandbox's ID: %q, %v", id, err)
	}
}

// TestIndexKeepsOtherOrgsID: the store's duplicate ID counts as "recorded already" only
// for the same organization, runner and request; the index never replaces another
// organization's record.
func TestIndexKeepsOtherOrgsID(t *testing.T) {
	ctx := t.Context()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{testOrg, "org-b"} {
		if _, err := st.Orgs().Create(ctx, store.Org{ID: o, Name: o}); err != nil {
			t.Fatal(err)
		}
	}
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "python:3.11"}}}
	rec := func(org, runnerID string) *record {
		return &record{id: "shared1", org: org, runnerID: runnerID, spec: spec, last: runner.Sandbox{ID: "shared1", State: runner.StateCreating}}
	}
	x := newIndex(st.Sandboxes(), quietLog())
	if err := x.put(ctx, rec(testOrg, "r1"), ""); err != nil {
		t.Fatal(err)
	}
	if err := x.put(ctx, rec("org-b", "r1"), ""); err == nil {
		t.Fatal("org-b's record replaced org-a's")
	}
	other := newIndex(st.Sandboxes(), quietLog()) // another replica: memory empty
	if err := other.persistNew(ctx, rec("org-b", "r1"), ""); err == nil {
		t.Fatal("the store's org-a row counted as org-b's record")
	}
	if err := other.persistNew(ctx, rec(testOrg, "r2"), ""); err == nil {
		t.Fatal("the store's row of another runner counted as recorded")
	}
	if err := other.persistNew(ctx, rec(testOrg, "r1"), ""); err != nil {
		t.Fatalf("a retried write: %v", err)
	}
	if r, ok := x.get(ctx, testOrg, "shared1"); !ok || r.org != testOrg {
		t.Fatal("org-a's record is gone")
	}
	mem := newIndex(nil, quietLog())
	if err := mem.put(ctx, rec(testOrg, "r1"), ""); err != nil {
		t.Fatal(err)
	}
	if err := mem.put(ctx, rec("org-b", "r1"), ""); err == nil {
		t.Fatal("memory index: org-b's record replaced org-a's")
	}
}
