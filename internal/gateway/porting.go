package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Checkpoints across runners (runner.PortHandle): a checkpointed sandbox resumes on
// another runner when its own has no room or is not allowed (it moves there through the
// blob store), and forks go to other runners when the source's has no room for them.

// sandboxLocks serializes this gateway's resumes (which may move a sandbox) and forks of
// one sandbox, so two resumes do not both move it.
type sandboxLocks struct {
	mu sync.Mutex
	m  map[string]*sandboxLock
}

type sandboxLock struct {
	ch chan struct{} // holds one token while locked
	n  int           // holders and waiters
}

// lock takes id's lock, or fails when ctx ends first.
func (l *sandboxLocks) lock(ctx context.Context, id string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sandboxLock{}
	}
	e := l.m[id]
	if e == nil {
		e = &sandboxLock{ch: make(chan struct{}, 1)}
		l.m[id] = e
	}
	e.n++
	l.mu.Unlock()
	done := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if e.n--; e.n == 0 {
			delete(l.m, id)
		}
	}
	select {
	case e.ch <- struct{}{}:
	case <-ctx.Done():
		done()
		return nil, connect.NewError(connect.CodeOf(ctx.Err()), fmt.Errorf("waiting for another resume or fork of sandbox %s: %w", id, ctx.Err()))
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-e.ch
			done()
		})
	}, nil
}

// refusalKind is why a runner cannot take a checkpoint: never (it would need another
// platform, policy, runner_ids…), not now (no room), or unavailable.
type refusalKind int

const (
	refusedNever refusalKind = iota
	refusedRoom
	refusedDown
)

// portRefusal is why one runner cannot take a sandbox (its checkpoint, or a fork).
type portRefusal struct {
	runner, why string
	kind        refusalKind
}

// portTarget is a runner that can take a checkpoint, with placement's answer for one
// sandbox of its spec there.
type portTarget struct {
	h runner.PortHandle
	c placement.Candidate
}

// checkpointClass is the runtime class of sandbox src on runner from ("" = none known).
func (s *Server) checkpointClass(ctx context.Context, from runner.Handle, src runner.Sandbox) string {
	if src.RuntimeClass != "" {
		return src.RuntimeClass
	}
	if src.Spec.RuntimeClass != "" {
		return src.Spec.RuntimeClass
	}
	if c, ok := s.views.capacityOf(ctx, from.ID()); ok && len(c.RuntimeClasses) > 0 {
		return c.RuntimeClasses[0] // the runner's default
	}
	return ""
}

// checkpointTargets are the runners other than from that can take the checkpoint of
// rec (src on from), least loaded first: PortHandles allowed by allowed (empty: any)
// whose platform for its runtime class is from's, whose current policy accepts its spec
// (as a fork's: placeFork) and that have room for one; and why every other runner
// cannot.
func (s *Server) checkpointTargets(ctx context.Context, rec *record, from runner.Handle, src runner.Sandbox, allowed []string) ([]portTarget, []portRefusal) {
	if _, ok := from.(runner.PortHandle); !ok {
		return nil, []portRefusal{{runner: from.ID(), why: "cannot export checkpoints (its runner does not move them through the blob store)"}}
	}
	class := s.checkpointClass(ctx, from, src)
	srcPlatform := s.views.checkpointPlatform(ctx, from.ID(), class)
	if srcPlatform == "" {
		if _, ok := s.views.capacityOf(ctx, from.ID()); !ok {
			// Its platform is not known while it is not connected (a runner just
			// restarted, not probed again yet): not a refusal for ever.
			return nil, []portRefusal{{runner: from.ID(), why: "unavailable: not connected, its checkpoint platform is not known", kind: refusedDown}}
		}
		return nil, []portRefusal{{runner: from.ID(), why: fmt.Sprintf("exports no checkpoints of runtime class %q to the blob store", class)}}
	}
	views := s.placementRunners(ctx)
	refFields := secretRefFieldsOf(rec, src)
	addr, public := callerOf(ctx)
	var (
		out     []portTarget
		refused []portRefusal
	)
	for i, h := range s.runners {
		id := h.ID()
		if id == from.ID() || !s.serves(h, rec.org) || !s.sameOwner(h, from) {
			// Another organization's runner is no target, and is not named; nor is a
			// runner of another owner than the source's (sameOwner).
			continue
		}
		refuse := func(kind refusalKind, format string, args ...any) {
			refused = append(refused, portRefusal{runner: id, why: fmt.Sprintf(format, args...), kind: kind})
		}
		if len(allowed) > 0 && !slices.Contains(allowed, id) {
			refuse(refusedNever, "not allowed by runner_ids")
			continue
		}
		ph, ok := h.(runner.PortHandle)
		if !ok {
			refuse(refusedNever, "cannot import checkpoints (its runner does not move them through the blob store)")
			continue
		}
		if i >= len(views) || !views[i].Ready {
			why := "not connected"
			if i < len(views) && views[i].NotReady != "" {
				why = views[i].NotReady
			}
			refuse(refusedDown, "unavailable: %s", why)
			continue
		}
		if p := s.views.checkpointPlatform(ctx, id, class); p != srcPlatform {
			if p == "" {
				p = "none"
			}
			refuse(refusedNever, "checkpoint platform differs for runtime class %q: %s has %q, %s has %q", class, from.ID(), srcPlatform, id, p)
			continue
		}
		sp := proto.CloneOf(rec.spec)
		sp.RunnerIds = []string{id}
		cands, err := placement.Place(placement.Request{Spec: sp, Org: rec.org, Engine: src.Spec.Engine, Runners: views,
			Platform: policy.RunnerPlatform(nil), Reservations: &s.reserved, CheckSource: public, Source: addr,
			SecretRefFields: refFields}) // as a create's: only runners that read them
		if err != nil {
			kind, why := placementRefusal(id, err)
			refuse(kind, "%s", why)
			continue
		}
		out = append(out, portTarget{h: ph, c: cands[0]})
	}
	slices.SortStableFunc(out, func(a, b portTarget) int {
		switch {
		case a.c.Load < b.c.Load:
			return -1
		case a.c.Load > b.c.Load:
			return 1
		}
		return 0
	})
	return out, refused
}

// placementRefusal is why placement on the one runner id refused: err is Place's.
func placementRefusal(id string, err error) (refusalKind, string) {
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	switch connect.CodeOf(err) {
	case connect.CodeResourceExhausted:
		msg = strings.TrimPrefix(msg, "no runner has room for this sandbox now: ")
		return refusedRoom, "no room: " + strings.TrimPrefix(msg, id+": ")
	case connect.CodeUnavailable:
		return refusedDown, msg
	}
	if vs := apierr.Violations(err); len(vs) > 0 && connect.CodeOf(err) == connect.CodeInvalidArgument {
		return refusedNever, "its policy rejects it: " + apierr.Describe(vs)
	}
	return refusedNever, msg
}

// refusedError is the error for sandbox id that no runner can take (what: "move
// sandbox …"), listing why per runner: RESOURCE_EXHAUSTED CWSANDBOX_RUNNER_CAPACITY_
// EXHAUSTED with RetryInfo when a runner lacks only room, UNAVAILABLE CWSANDBOX_RUNNER_
// UNAVAILABLE when one is down, FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED
// when none could ever take it.
func refusedError(id, what string, refused []portRefusal) error {
	var (
		parts        []string
		vs           []apierr.Violation
		anyRoom, any bool
		anyDown      bool
	)
	for _, r := range refused {
		parts = append(parts, r.runner+": "+r.why)
		vs = append(vs, apierr.Violation{Field: "runner[" + r.runner + "]", Description: r.why})
		anyRoom = anyRoom || r.kind == refusedRoom
		anyDown = anyDown || r.kind == refusedDown
		any = true
	}
	if !any {
		parts = append(parts, "no runner is connected")
	}
	msg := fmt.Sprintf("cannot %s: %s", what, strings.Join(parts, "; "))
	md := map[string]string{"sandbox_id": id}
	switch {
	case anyRoom:
		return apierr.WithRetry(apierr.WithViolations(apierr.New(apierr.RunnerCapacityExhausted, msg, md), vs), placement.RetryAfter)
	case anyDown:
		return apierr.WithRetry(apierr.WithViolations(apierr.New(apierr.RunnerUnavailable, msg, md), vs), placement.RetryAfter)
	}
	return apierr.WithViolations(apierr.New(apierr.CheckpointNotSupported, msg, md), vs)
}

// moveSandbox moves PAUSED, checkpointed sandbox rec (src) from runner from to a runner
// of allowed (empty: any) that can take its checkpoint, and returns it as it runs there
// and that runner. own is why it does not resume on from. The move: the checkpoint is
// exported on from (read as it is), imported on the target with the source's ID, Meta
// and share token; then the index names the target (store and memory), from forgets
// the sandbox (Moved) and the export is deleted. When the import (or the record) fails,
// the sandbox stays PAUSED on from as it was and the export is deleted.
func (s *Server) moveSandbox(ctx context.Context, rec *record, from runner.Handle, src runner.Sandbox, allowed []string, own portRefusal) (runner.Sandbox, runner.Handle, error) {
	targets, refused := s.checkpointTargets(ctx, rec, from, src, allowed)
	refused = append([]portRefusal{own}, refused...)
	what := fmt.Sprintf("resume sandbox %s on another runner", rec.id)
	for _, t := range targets {
		release, why := s.reserved.ClaimN(t.c, 1)
		if why != "" {
			refused = append(refused, portRefusal{runner: t.c.RunnerID, why: "no room: " + why, kind: refusedRoom})
			continue
		}
		sb, to, err := s.moveTo(ctx, rec, from.(runner.PortHandle), src, t)
		release()
		return sb, to, err
	}
	return runner.Sandbox{}, nil, refusedError(rec.id, what, refused)
}

// moveTo is moveSandbox's move to t, its room claimed.
func (s *Server) moveTo(ctx context.Context, rec *record, from runner.PortHandle, src runner.Sandbox, t portTarget) (runner.Sandbox, runner.Handle, error) {
	bg := context.WithoutCancel(ctx)
	// Its egress secrets' values for the target, resolved again from the store by
	// reference (the record's), as for a fork: the export carries only the CA and
	// placeholders (CheckpointRef.Egress, over the runner wire).
	egressValues, err := s.forkEgressSecretValues(ctx, rec.org, rec, src)
	if err != nil {
		return runner.Sandbox{}, nil, err
	}
	ref, exported, err := from.ExportCheckpoint(ctx, rec.id)
	if err != nil {
		err = runner.APIError(rec.id, err, "")
		s.exportFailed(ctx, from, rec.org, err)
		return runner.Sandbox{}, nil, err
	}
	dropExport := func() {
		if err := from.DeleteCheckpoint(bg, ref.Key); err != nil {
			s.log.Warn("delete exported checkpoint", "sandbox", rec.id, "runner", from.ID(), "key", ref.Key, "err", err)
		}
	}
	if exported.ID == "" {
		exported = src
	}
	target := runner.ForkTarget{ID: rec.id, Meta: maps.Clone(exported.Spec.Meta), ShareTokenHash: exported.Spec.ShareTokenHash, EgressSecretValues: egressValues}
	if target.Meta == nil {
		target.Meta = map[string]string{}
	}
	// The organization is the gateway's record's, never the exporting runner's word.
	target.Meta[runtime.MetaOrg] = rec.org
	results, err := t.h.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: exported, Targets: []runner.ForkTarget{target}, Move: true})
	if err == nil {
		switch {
		case len(results) != 1:
			err = connect.NewError(connect.CodeInternal, fmt.Errorf("runner %s returned %d results for moving one sandbox", t.h.ID(), len(results)))
		case results[0].Err != nil:
			err = results[0].Err
		}
	}
	judged := runner.Sandbox{}
	if err == nil {
		judged = results[0].Sandbox
		judged.ID = cmp.Or(judged.ID, rec.id)
	}
	s.judgePlacement(ctx, t.h, rec.org, judged, err) // the target's health
	if err != nil {
		dropExport()
		s.log.Warn("sandbox move failed: it stays paused", "sandbox", rec.id, "from", from.ID(), "to", t.h.ID(), "err", err)
		return runner.Sandbox{}, nil, runner.APIError(rec.id, err, "")
	}
	sb := results[0].Sandbox
	if sb.ID == "" {
		sb.ID = rec.id
	}
	// The copy on t is dropped when the move is abandoned.
	dropCopy := func() {
		if _, derr := t.h.Delete(bg, rec.id, 0); derr != nil {
			s.log.Warn("delete the copy of an abandoned move", "sandbox", rec.id, "runner", t.h.ID(), "err", derr)
		}
	}
	// Traffic that reached the old runner meanwhile may have resumed the sandbox there
	// (auto-resume): then it runs there, newer than the copy.
	if now, gerr := from.Get(ctx, rec.id); gerr == nil && now.State != runner.StatePaused {
		dropCopy()
		dropExport()
		if now.State == runner.StateRunning {
			s.log.Info("sandbox resumed on its runner during its move: the move is abandoned", "sandbox", rec.id, "runner", from.ID())
			return now, from, nil
		}
		return runner.Sandbox{}, nil, apierr.New(apierr.SandboxNotRunning,
			fmt.Sprintf("sandbox %s became %s on runner %s during its move", rec.id, now.State, from.ID()), map[string]string{"sandbox_id": rec.id})
	}
	if err := s.index.moved(ctx, rec, t.h.ID(), sb); err != nil {
		// Not recorded: the API would not reach it there. The source stays as it was.
		dropCopy()
		dropExport()
		return runner.Sandbox{}, nil, connect.NewError(connect.CodeUnavailable, err)
	}
	s.views.confirmed(t.c.Index, t.c.Need)
	if err := from.Moved(bg, rec.id, t.h.ID()); err != nil {
		if apierr.Reason(runner.APIError(rec.id, err, "")) == apierr.SandboxNotRunning {
			// It was resumed on the old runner after all (auto-resume): that copy is the
			// newer one; the move is undone.
			if now, gerr := from.Get(bg, rec.id); gerr == nil && now.State == runner.StateRunning {
				if uerr := s.index.moved(bg, rec, from.ID(), now); uerr == nil {
					dropCopy()
					dropExport()
					s.log.Warn("sandbox resumed on its runner during its move: the move is undone", "sandbox", rec.id, "runner", from.ID())
					return now, from, nil
				}
			}
		}
		// Its paused copy stays on from until the reconciler deletes it.
		s.log.Warn("tell the old runner the sandbox moved", "sandbox", rec.id, "runner", from.ID(), "err", err)
	}
	dropExport()
	s.views.poke()
	s.log.Info("sandbox moved", "sandbox", rec.id, "org", rec.org, "from", from.ID(), "to", t.h.ID(), "checkpoint_bytes", ref.Bytes)
	return sb, t.h, nil
}

// capacityOf is runner id's capacity as last probed.
func (v *runnerViews) capacityOf(ctx context.Context, id string) (runner.Capacity, bool) {
	v.ensureLoaded(ctx)
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, r := range v.s.runners {
		if r.ID() == id && v.views[i].connected {
			return v.views[i].capacity, true
		}
	}
	return runner.Capacity{}, false
}

// checkpointPlatform is the platform runner id's checkpoints of runtime class need
// (Capacity.CheckpointPlatforms; "" = it moves none).
func (v *runnerViews) checkpointPlatform(ctx context.Context, id, class string) string {
	c, ok := v.capacityOf(ctx, id)
	if !ok {
		return ""
	}
	if p := c.CheckpointPlatforms[class]; p != "" || class != "" || len(c.RuntimeClasses) == 0 {
		return p
	}
	return c.CheckpointPlatforms[c.RuntimeClasses[0]]
}

// forkGroup is the forks of one ForkSandbox made on one runner.
type forkGroup struct {
	h runner.Handle
	// port imports them from the source's exported checkpoint; nil: the source's own
	// runner forks them (PauseHandle.Fork).
	port runner.PortHandle
	c    placement.Candidate
	n    int
}

// placeForks places n forks of rec (src on its runner r), claiming their room: on r
// when runner_ids (allowed) lets it, as many as fit there; the rest on runners that can
// take r's checkpoint (checkpointTargets), filling each in placement order. All n are
// placed or none (the error says per runner why).
func (s *Server) placeForks(ctx context.Context, rec *record, r runner.Handle, src runner.Sandbox, allowed []string, n int) ([]forkGroup, func(), error) {
	var (
		groups   []forkGroup
		releases []func()
		left     = n
		own      portRefusal
		ownErr   error
	)
	releaseAll := func() {
		for _, f := range releases {
			f()
		}
	}
	if len(allowed) == 0 || slices.Contains(allowed, r.ID()) {
		c, err := s.placeFork(ctx, rec, r, src)
		if err != nil {
			ownErr = err
			kind, why := placementRefusal(r.ID(), err)
			own = portRefusal{runner: r.ID(), why: "its runner: " + why, kind: kind}
		} else {
			k, release, why := s.reserved.ClaimUpTo(c, left)
			if k > 0 {
				groups = append(groups, forkGroup{h: r, c: c, n: k})
				releases = append(releases, release)
				left -= k
			}
			if left > 0 {
				own = portRefusal{runner: r.ID(), why: fmt.Sprintf("its runner: room for %d of %d forks: %s", k, n, why), kind: refusedRoom}
				ownErr = placement.CapacityExhausted([]string{fmt.Sprintf("%s: %d forks: %s", r.ID(), n, why)})
			}
		}
	} else {
		own = portRefusal{runner: r.ID(), why: "its runner, not allowed by runner_ids"}
	}
	if left == 0 {
		return groups, releaseAll, nil
	}
	if ownErr != nil && (len(s.runners) == 1 || (len(allowed) == 1 && allowed[0] == r.ID())) {
		// Only the source's runner to consider: its answer, as a create's.
		releaseAll()
		return nil, nil, ownErr
	}
	targets, refused := s.checkpointTargets(ctx, rec, r, src, allowed)
	refused = append([]portRefusal{own}, refused...)
	for _, t := range targets {
		if left == 0 {
			break
		}
		k, release, why := s.reserved.ClaimUpTo(t.c, left)
		if k == 0 {
			refused = append(refused, portRefusal{runner: t.c.RunnerID, why: "no room: " + why, kind: refusedRoom})
			continue
		}
		groups = append(groups, forkGroup{h: t.h, port: t.h, c: t.c, n: k})
		releases = append(releases, release)
		if left -= k; left > 0 {
			refused = append(refused, portRefusal{runner: t.c.RunnerID, why: fmt.Sprintf("room for %d more: %s", k, why), kind: refusedRoom})
		}
	}
	if left > 0 {
		releaseAll()
		return nil, nil, refusedError(rec.id, fmt.Sprintf("place %d forks of sandbox %s (room for %d)", n, rec.id, n-left), refused)
	}
	return groups, releaseAll, nil
}

// runForks makes the forks of groups (targets, group after group): the source's runner's
// with PauseHandle.Fork, the others' with ImportFork from the source's checkpoint,
// exported once before any and deleted after all. It returns one result per target; an
// error of a whole call is each of its forks' error, or the answer when there is one
// group.
func (s *Server) runForks(ctx context.Context, rec *record, ph runner.PauseHandle, src runner.Sandbox, groups []forkGroup, targets []runner.ForkTarget) ([]runner.ForkResult, error) {
	var (
		ref      runner.CheckpointRef
		exported runner.Sandbox
	)
	if slices.ContainsFunc(groups, func(g forkGroup) bool { return g.port != nil }) {
		from, ok := ph.(runner.PortHandle)
		if !ok { // checkpointTargets places none then
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("runner %s cannot export checkpoints", ph.ID()))
		}
		var err error
		ref, exported, err = from.ExportCheckpoint(ctx, rec.id)
		if err != nil {
			err = runner.APIError(rec.id, err, "")
			s.exportFailed(ctx, from, rec.org, err)
			return nil, err
		}
		defer func() {
			if err := from.DeleteCheckpoint(context.WithoutCancel(ctx), ref.Key); err != nil {
				s.log.Warn("delete exported checkpoint", "sandbox", rec.id, "runner", from.ID(), "key", ref.Key, "err", err)
			}
		}()
		if exported.ID == "" {
			exported = src
		}
	}
	results := make([]runner.ForkResult, len(targets))
	off := 0
	for _, g := range groups {
		ts := targets[off : off+g.n]
		var (
			rs  []runner.ForkResult
			err error
		)
		if g.port == nil {
			rs, err = ph.Fork(ctx, rec.id, ts)
		} else {
			rs, err = g.port.ImportFork(ctx, runner.ImportRequest{Ref: ref, Source: exported, Targets: ts})
		}
		s.judgeForks(ctx, g.h, rec.org, ts, rs, err)
		if err != nil {
			if len(groups) == 1 {
				return nil, runner.APIError(rec.id, err, "")
			}
			err = fmt.Errorf("runner %s: %w", g.h.ID(), err)
		}
		for i := range ts {
			switch {
			case err != nil:
				results[off+i].Err = err
			case i >= len(rs):
				results[off+i].Err = connect.NewError(connect.CodeInternal, fmt.Errorf("runner %s returned no result for this fork", g.h.ID()))
			default:
				results[off+i] = rs[i]
			}
		}
		off += g.n
	}
	return results, nil
}

// judgeForks judges the forks ts made on r (rs, or the whole call's err) for its health,
// each as a create.
func (s *Server) judgeForks(ctx context.Context, r runner.Handle, org string, ts []runner.ForkTarget, rs []runner.ForkResult, err error) {
	if err != nil {
		s.judgePlacement(ctx, r, org, runner.Sandbox{}, err) // one request failed: counted once
		return
	}
	for i, res := range rs[:min(len(rs), len(ts))] {
		sb := res.Sandbox
		sb.ID = cmp.Or(sb.ID, ts[i].ID)
		s.judgePlacement(ctx, r, org, sb, res.Err)
	}
}
