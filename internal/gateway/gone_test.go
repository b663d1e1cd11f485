package gateway

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// calledRunner is an accepting runner whose owner can change (a re-registration) and
// which counts every call about a sandbox it gets.
type calledRunner struct {
	acceptingRunner
	omu     sync.Mutex
	org     string
	known   bool
	calls   []string
	deleted []string
	down    bool // unreachable: Get fails as a transport error
}

func (r *calledRunner) Owner() (string, bool) {
	r.omu.Lock()
	defer r.omu.Unlock()
	return r.org, r.known
}

func (r *calledRunner) setOwner(org string, known bool) {
	r.omu.Lock()
	defer r.omu.Unlock()
	r.org, r.known, r.calls = org, known, nil
}

func (r *calledRunner) called() []string {
	r.omu.Lock()
	defer r.omu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *calledRunner) Get(ctx context.Context, id string) (runner.Sandbox, error) {
	r.omu.Lock()
	r.calls = append(r.calls, "Get "+id)
	down := r.down
	r.omu.Unlock()
	if down {
		return runner.Sandbox{}, errors.New("connection refused")
	}
	return r.acceptingRunner.Get(ctx, id)
}

func (r *calledRunner) Delete(ctx context.Context, id string, _ time.Duration) (runner.Sandbox, error) {
	r.omu.Lock()
	r.calls = append(r.calls, "Delete "+id)
	r.deleted = append(r.deleted, id)
	r.omu.Unlock()
	r.acceptingRunner.mu.Lock()
	defer r.acceptingRunner.mu.Unlock()
	sb := r.got[id]
	sb.State, sb.Reason, sb.EndedAt = runner.StateTerminated, runner.ReasonDeleted, time.Now()
	r.got[id] = sb
	return sb, nil
}

func (r *calledRunner) List(context.Context) ([]runner.Sandbox, error) {
	r.acceptingRunner.mu.Lock()
	defer r.acceptingRunner.mu.Unlock()
	var out []runner.Sandbox
	for _, sb := range r.got {
		out = append(out, sb)
	}
	return out, nil
}

// TestDeleteWithoutRunner: a sandbox whose runner was re-registered to another
// organization, or which this gateway does not have, was UNAVAILABLE for ever, delete
// included. A delete now ends its record (TERMINATED, reason Lost) without sending the
// runner anything; Get and List show it ended, in this gateway and in another replica
// over the same store; other operations stay refused. A runner not verified yet is not
// gone (still UNAVAILABLE). Should the runner serve the organization again, its copy is
// deleted by Reconcile and the record stays ended.
func TestDeleteWithoutRunner(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: testOrg, Name: testOrg}); err != nil {
		t.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	platform := &acceptingRunner{id: "p-1"}
	tenant := &calledRunner{acceptingRunner: acceptingRunner{id: "t-1"}, org: testOrg, known: true}
	gateway := func(runners ...runner.Handle) *Server {
		s, err := New(Config{Auth: keys, Runners: runners, PlatformOrg: "platform", Index: st.Sandboxes(), Orgs: st.Orgs(), Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	s := gateway(platform, tenant)
	create := func() string {
		res, err := s.CreateSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Image: "python:3.11"}}, RunnerIds: []string{"t-1"}}}}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetSandboxId()
	}
	get := func(s *Server, id string) (*sandboxv1.Sandbox, error) {
		res, err := s.GetSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	del := func(s *Server, id string, volumes ...string) (*sandboxv1.Sandbox, error) {
		res, err := s.DeleteSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, SnapshotVolumes: volumes}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetSandbox(), nil
	}
	unavailable := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.RunnerUnavailable {
			t.Errorf("%s: %v, want UNAVAILABLE %s", what, err, apierr.RunnerUnavailable)
		}
	}
	ended := func(what string, sb *sandboxv1.Sandbox, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		st := sb.GetStatus()
		if st.GetState() != sandboxv1.State_STATE_TERMINATED || !strings.HasPrefix(st.GetStateReason(), ReasonLost+": deleted without its runner") ||
			st.GetEndTime() == nil || st.GetRunnerId() != "t-1" {
			t.Errorf("%s: %v, want TERMINATED (%s) on t-1 with an end time", what, sb, ReasonLost)
		}
	}

	reRegistered, absent, unverified := create(), create(), create()

	// t-1 is re-registered to another organization: nothing of org-a's goes to it.
	tenant.setOwner("org-x", true)
	_, err = get(s, reRegistered)
	unavailable("get before the delete", err)
	_, err = del(s, reRegistered, "data")
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != "snapshot_volumes" {
		t.Errorf("delete with snapshots: %v, want FAILED_PRECONDITION on snapshot_volumes", err)
	}
	sb, err := del(s, reRegistered)
	ended("delete", sb, err)
	sb, err = get(s, reRegistered)
	ended("get after the delete", sb, err)
	sb, err = del(s, reRegistered)
	ended("a second delete", sb, err)
	_, err = s.ReadFile(asOrg(ctx), connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: reRegistered, Path: "/etc/hostname"}))
	unavailable("read file", err)
	list, err := s.ListSandboxes(asOrg(ctx), connect.NewRequest(&sandboxv1.ListSandboxesRequest{ShowTerminated: true}))
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]sandboxv1.State{}
	for _, sb := range list.Msg.GetSandboxes() {
		states[sb.GetSandboxId()] = sb.GetStatus().GetState()
	}
	if states[reRegistered] != sandboxv1.State_STATE_TERMINATED || len(states) != 3 {
		t.Errorf("listed %v, want %s TERMINATED and the others as last seen", states, reRegistered)
	}
	if calls := tenant.called(); len(calls) != 0 {
		t.Fatalf("the re-registered runner was sent %v", calls)
	}

	// Another replica over the same store (its runner re-registered too) sees it ended.
	sb, err = get(gateway(platform, tenant), reRegistered)
	ended("another replica's get", sb, err)

	// A gateway that does not have t-1 (removed, or never reconnected).
	g2 := gateway(platform)
	_, err = get(g2, absent)
	unavailable("get on a gateway without the runner", err)
	sb, err = del(g2, absent)
	ended("delete on a gateway without the runner", sb, err)
	sb, err = get(g2, absent)
	ended("get on a gateway without the runner, after the delete", sb, err)

	// A runner not verified yet may serve the sandbox after its handshake: not gone.
	tenant.setOwner("", false)
	_, err = del(s, unverified)
	unavailable("delete on an unverified runner", err)
	if calls := tenant.called(); len(calls) != 0 {
		t.Fatalf("the unverified runner was sent %v", calls)
	}

	// t-1 serves org-a again (a gateway started since: runners are a gateway's start-up
	// configuration): the sandboxes deleted meanwhile are deleted there by Reconcile, and
	// their records stay ended.
	tenant.setOwner(testOrg, true)
	s = gateway(platform, tenant)
	if n := s.Reconcile(ctx); n != 2 {
		t.Errorf("Reconcile deleted %d, want the 2 deleted without their runner", n)
	}
	tenant.omu.Lock()
	deleted := strings.Join(tenant.deleted, ",")
	tenant.omu.Unlock()
	if !strings.Contains(deleted, reRegistered) || !strings.Contains(deleted, absent) || strings.Contains(deleted, unverified) {
		t.Errorf("t-1 was asked to delete %s, want %s and %s", deleted, reRegistered, absent)
	}
	sb, err = get(s, reRegistered)
	ended("get once the runner serves again", sb, err)
	if sb, err := get(s, unverified); err != nil || sb.GetStatus().GetState() == sandboxv1.State_STATE_TERMINATED {
		t.Errorf("the sandbox not deleted: %v %v", sb, err)
	}
}

// TestPurgeWithoutRunner: PurgeSandboxes ends the records of sandboxes whose runner was
// re-registered to another organization as DeleteSandbox does, and sends it nothing (it
// used to send the runner a Get and a Delete).
func TestPurgeWithoutRunner(t *testing.T) {
	tenant := &calledRunner{acceptingRunner: acceptingRunner{id: "t-1"}, org: testOrg, known: true}
	s := newTestGateway(t, t.TempDir(), tenant)
	ctx := t.Context()
	res, err := s.CreateSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "python:3.11"}}}}}))
	if err != nil {
		t.Fatal(err)
	}
	tenant.setOwner("org-x", true)
	for _, dry := range []bool{true, false} {
		out, err := s.PurgeSandboxes(asOrg(ctx), connect.NewRequest(&sandboxv1.PurgeSandboxesRequest{PurgeAll: true, DryRun: dry}))
		if err != nil || out.Msg.GetPurgeCount() != 1 || len(out.Msg.GetFailedSandboxIds())+len(out.Msg.GetRetryableFailedSandboxIds()) != 0 {
			t.Fatalf("purge (dry run %v): %v %v, want 1 purged", dry, out, err)
		}
	}
	g, err := s.GetSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: res.Msg.GetSandboxId()}))
	if err != nil || g.Msg.GetStatus().GetState() != sandboxv1.State_STATE_TERMINATED {
		t.Fatalf("after the purge: %v %v, want TERMINATED", g, err)
	}
	if calls := tenant.called(); len(calls) != 0 {
		t.Fatalf("the re-registered runner was sent %v", calls)
	}
}

// TestDeletedWithoutRunnerSeenByAnotherReplica: a replica whose copy of the record is
// older (it still reaches the runner under its old owner, pinned at its handshake; now
// unreachable for it) shows the sandbox ended once another replica deleted it without
// its runner, rather than its own last status.
func TestDeletedWithoutRunnerSeenByAnotherReplica(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: testOrg, Name: testOrg}); err != nil {
		t.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	gateway := func(r runner.Handle) *Server {
		s, err := New(Config{Auth: keys, Runners: []runner.Handle{r}, PlatformOrg: "platform", Index: st.Sandboxes(), Orgs: st.Orgs(), Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	pinned := &calledRunner{acceptingRunner: acceptingRunner{id: "t-1"}, org: testOrg, known: true}
	b := gateway(pinned)
	res, err := b.CreateSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "python:3.11"}}}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	get := func(s *Server) sandboxv1.State {
		g, err := s.GetSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return g.Msg.GetStatus().GetState()
	}
	if st := get(b); st == sandboxv1.State_STATE_TERMINATED {
		t.Fatalf("state %s before the delete", st)
	}
	a := gateway(&calledRunner{acceptingRunner: acceptingRunner{id: "t-1"}, org: "org-x", known: true})
	if _, err := a.DeleteSandbox(asOrg(ctx), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	pinned.omu.Lock()
	pinned.down = true
	pinned.omu.Unlock()
	if st := get(b); st != sandboxv1.State_STATE_TERMINATED {
		t.Fatalf("the other replica shows %s, want TERMINATED", st)
	}
}
