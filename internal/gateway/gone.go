package gateway

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// A sandbox whose runner is gone for it: one this gateway does not have (removed, or
// never reconnected), or one that now belongs to another organization (re-registered;
// owner.go). Nothing of the sandbox's goes to such a runner, so every operation on the
// sandbox is UNAVAILABLE (lookup) except these two:
//   - DeleteSandbox (and PurgeSandboxes) ends the gateway's record (TERMINATED, reason
//     Lost: deleted without its runner) and sends the runner nothing; the runner was not
//     asked to stop it.
//   - GetSandbox and ListSandboxes of a sandbox whose record has ended answer that last
//     status without asking the runner.
// A runner not verified yet is not gone: it may serve the sandbox after its first
// handshake (UNAVAILABLE with RetryInfo meanwhile, Delete included). Should a gone runner
// serve the sandbox's organization again (the gateway gets it back), Reconcile deletes
// the sandbox there, and its record stays ended (current).

// deletedWithoutRunner reports whether sb is the status DeleteSandbox gave a sandbox
// whose runner was gone: it stays so, whatever the runner says later.
func deletedWithoutRunner(sb runner.Sandbox) bool {
	return sb.State == runner.StateTerminated && sb.Reason == ReasonLost
}

// goneRunner is the runner of rec if it is gone for the sandbox (see above), as the
// sandbox's public form names it.
func (s *Server) goneRunner(ctx context.Context, rec *record) (runnerName, bool) {
	rid := s.index.runnerOf(rec)
	r := s.runnerByID(rid)
	if r == nil {
		return absentRunner(rid), true
	}
	s.views.ensureLoaded(ctx)
	if _, known := s.runnerOwner(r); known && !s.serves(r, rec.org) {
		return r, true
	}
	return nil, false
}

// withoutRunner is the record of sandbox id, its last status (re-read from the store:
// another gateway replica may have ended it) and its runner's name when lookup refused
// the sandbox with err because its runner is gone for it.
func (s *Server) withoutRunner(ctx context.Context, id string, err error) (*record, runner.Sandbox, runnerName, bool) {
	if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.RunnerUnavailable {
		return nil, runner.Sandbox{}, nil, false
	}
	rec, ok := s.index.get(ctx, principal(ctx).Org, id)
	if !ok {
		return nil, runner.Sandbox{}, nil, false
	}
	name, gone := s.goneRunner(ctx, rec)
	if !gone {
		return nil, runner.Sandbox{}, nil, false
	}
	s.index.refreshLast(ctx, rec)
	return rec, s.index.lastOf(rec), name, true
}

// deleteWithoutRunner is DeleteSandbox of a sandbox whose runner is gone for it: its
// record ends (TERMINATED, reason Lost) and the runner is sent nothing. ok is false when
// its runner is not gone (err stands). Snapshots on delete need the runner: refused.
func (s *Server) deleteWithoutRunner(ctx context.Context, m *sandboxv1.DeleteSandboxRequest, err error) (*sandboxv1.DeleteSandboxResponse, bool, error) {
	rec, last, name, ok := s.withoutRunner(ctx, m.GetSandboxId(), err)
	if !ok {
		return nil, false, nil
	}
	if len(m.GetSnapshotVolumes()) > 0 {
		return nil, true, apierr.Invalid(apierr.FSSNotSupported, fmt.Sprintf("runner %s of sandbox %s no longer serves it: its volumes cannot be snapshotted; delete it without snapshot_volumes", name.ID(), rec.id),
			[]apierr.Violation{{Field: "snapshot_volumes", Description: "must be empty: the sandbox's runner is gone"}})
	}
	if !last.State.Terminal() {
		last = s.endWithoutRunner(ctx, rec, last, name)
	}
	return &sandboxv1.DeleteSandboxResponse{Sandbox: s.toProto(rec, last, name)}, true, nil
}

// endWithoutRunner ends the record of rec (last status last; not ended) whose runner
// (name) is gone for it: TERMINATED, reason Lost.
func (s *Server) endWithoutRunner(ctx context.Context, rec *record, last runner.Sandbox, name runnerName) runner.Sandbox {
	why := "is not one of this gateway's runners"
	if _, absent := name.(absentRunner); !absent {
		why = "no longer serves this organization"
	}
	sb := last
	sb.State, sb.Reason, sb.EndedAt, sb.IP = runner.StateTerminated, ReasonLost, time.Now(), ""
	sb.Message = fmt.Sprintf("deleted without its runner: runner %s %s, so it was not asked to stop the sandbox", name.ID(), why)
	s.log.Warn("sandbox deleted without its runner", "sandbox", rec.id, "org", rec.org, "runner", name.ID(), "was", last.State, "why", why)
	s.index.setLast(ctx, rec, sb)
	return sb
}

// endedWithoutRunner is GetSandbox of a sandbox whose runner is gone for it and whose
// record has ended: that last status.
func (s *Server) endedWithoutRunner(ctx context.Context, id string, err error) (*sandboxv1.Sandbox, bool) {
	rec, last, name, ok := s.withoutRunner(ctx, id, err)
	if !ok || !last.State.Terminal() {
		return nil, false
	}
	return s.toProto(rec, last, name), true
}

// refreshLast re-reads rec's last status from the store when the store has it ended and
// this gateway's copy has not (another replica ended it).
func (x *index) refreshLast(ctx context.Context, rec *record) {
	if x.st == nil || x.lastOf(rec).State.Terminal() {
		return
	}
	st, err := x.st.Get(ctx, rec.org, rec.id)
	if err != nil {
		return
	}
	fresh, err := fromStore(st)
	if err != nil || !fresh.last.State.Terminal() {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !rec.last.State.Terminal() {
		rec.last = fresh.last
	}
}
