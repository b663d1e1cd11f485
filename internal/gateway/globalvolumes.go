package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
)

// GLOBAL registered volumes (docs/volumes.md "GLOBAL volumes"). The wire has one volume
// source, pvc{runner_id, namespace, claim_name}, and the official client requires a
// runner_id: sandboxd reads runner_id "*" (no runner's ID) as GLOBAL, a volume of no
// runner whose content lives in the blob store (runner.GlobalVolumePrefix) as committed
// generations. Any runner may mount it: each mount is a scratch copy restored from the
// latest generation. At most one live sandbox holds a read-write mount (the write
// lease, store-backed: store.Volumes.AcquireLease); its copy is uploaded as the next
// generation when it ends, by its runner, before the runner reports it ended — so "its
// holder has ended" is exactly "the lease is free and the new generation is committed".

const (
	// globalRunnerID is pvc.runner_id of a GLOBAL volume.
	globalRunnerID = "*"
	// pendingLeasePrefix marks a lease taken by a create in flight (its sandbox has no
	// ID yet); pendingLeaseTTL is how long such a lease counts when its create never
	// finished (a gateway that died mid-create).
	pendingLeasePrefix = "create:"
	pendingLeaseTTL    = 10 * time.Minute
	// globalEndWait bounds how long a mount waits for the writer that is ending (its
	// upload committing) before it reads the volume.
	globalEndWait = 2 * time.Minute
	// globalPoll is how often a waiting mount looks again.
	globalPoll = 200 * time.Millisecond
)

func isGlobal(v store.Volume) bool { return v.RunnerID == globalRunnerID }

// globalSize is v's size: what each copy's scratch volume and its archive may hold, and
// what its quota counts (spec.size; 10 GiB when unset).
func globalSize(v store.Volume) int64 {
	if v.SizeBytes > 0 {
		return v.SizeBytes
	}
	return runner.DefaultGlobalVolumeBytes
}

// globalPrefix is where v's generations are in the blob store.
func globalPrefix(v store.Volume) string { return runner.GlobalVolumePrefix(v.Org, v.ClaimName) }

// validateGlobal proves the blob store holds v: its manifest is read (generation 0, empty,
// written when missing) and checked, and the archive it names is there.
func (s *Server) validateGlobal(ctx context.Context, v store.Volume) (state, reason string, capacity int64) {
	if s.blobs == nil {
		return "ERROR", "GLOBAL volumes live in the blob store, and this gateway has none configured (see docs/blobstore.md)", 0
	}
	prefix := globalPrefix(v)
	m, err := runner.ReadGlobalManifest(ctx, s.blobs, prefix)
	if errors.Is(err, blob.ErrNotFound) {
		m = runner.GlobalManifest{Generation: 0, CommitTime: time.Now().UTC()}
		if err = runner.WriteGlobalManifest(ctx, s.blobs, prefix, m); err == nil {
			m, err = runner.ReadGlobalManifest(ctx, s.blobs, prefix)
		}
	}
	if err != nil {
		return "ERROR", "the blob store does not serve the volume: " + err.Error(), 0
	}
	if m.BlobKey != "" {
		info, err := s.blobs.Stat(ctx, m.BlobKey)
		if err != nil {
			return "ERROR", fmt.Sprintf("generation %d's archive: %v", m.Generation, err), 0
		}
		if info.Size != m.SizeBytes {
			return "ERROR", fmt.Sprintf("generation %d's archive is %d bytes, its manifest says %d", m.Generation, info.Size, m.SizeBytes), 0
		}
	}
	return "READY", "", globalSize(v)
}

// deleteGlobal removes v's content from the blob store and its lease.
func (s *Server) deleteGlobal(ctx context.Context, v store.Volume) error {
	if h, _, err := s.volumes.LeaseHolder(ctx, v.Org, v.ID); err == nil && h != "" {
		_ = s.volumes.ReleaseLease(ctx, v.Org, v.ID, h)
	}
	if s.blobs == nil {
		return nil // it never held anything
	}
	if err := runner.DeleteGlobalVolume(ctx, s.blobs, globalPrefix(v)); err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("delete the volume's content from the blob store: %w", err))
	}
	return nil
}

// globalPlan is how one create mounts one GLOBAL volume.
type globalPlan struct {
	vol      store.Volume
	manifest runner.GlobalManifest
	writer   bool // holds the write lease: its copy is committed as manifest.Generation+1
}

// globalSession is a create's GLOBAL volumes: the plans, and the leases it took under
// token until its sandbox has an ID (commit) or the create failed (release).
type globalSession struct {
	s      *Server
	org    string
	token  string
	plans  map[string]globalPlan // by volume ID
	leased []string              // volume IDs whose lease token holds
	// fields are the spec fields naming the GLOBAL volumes (sandbox.spec.volumes[i].volume_id):
	// placement sends the sandbox only to runners that mount them
	// (placement.Request.GlobalVolumeFields).
	fields []string
	// writers are those of fields mounted read-write (placement.Request.GlobalWriterFields).
	writers []string
}

// placementFields are the fields placement keeps to runners that mount GLOBAL volumes
// (nil for a create that mounts none).
func (g *globalSession) placementFields() []string {
	if g == nil {
		return nil
	}
	return g.fields
}

// writerFields are those of placementFields the create mounts read-write.
func (g *globalSession) writerFields() []string {
	if g == nil {
		return nil
	}
	return g.writers
}

type globalPlansKey struct{}

func withGlobalPlans(ctx context.Context, g *globalSession) context.Context {
	if g == nil || len(g.plans) == 0 {
		return ctx
	}
	return context.WithValue(ctx, globalPlansKey{}, g.plans)
}

// commit hands the leases from the create to its sandbox.
func (g *globalSession) commit(ctx context.Context, sandboxID string) {
	if g == nil {
		return
	}
	for _, id := range g.leased {
		if err := g.s.volumes.MoveLease(ctx, g.org, id, g.token, sandboxID); err != nil {
			g.s.log.Warn("GLOBAL volume lease not handed to its sandbox", "volume", id, "sandbox", sandboxID, "err", err)
		}
	}
	g.leased = nil
}

// release gives up the leases of a create that failed.
func (g *globalSession) release(ctx context.Context) {
	if g == nil {
		return
	}
	for _, id := range g.leased {
		_ = g.s.volumes.ReleaseLease(context.WithoutCancel(ctx), g.org, id, g.token)
	}
	g.leased = nil
}

// writesTo says whether sp mounts its volume called name read-write in any container.
func writesTo(sp *sandboxv1.SandboxSpec, name string) bool {
	for _, c := range sp.GetContainers() {
		for _, m := range c.GetVolumeMounts() {
			if m.GetVolume() == name && !m.GetReadOnly() {
				return true
			}
		}
	}
	return false
}

// holderState is the state of the lease holder h: live (holds it), ending (its runner
// is stopping it: its upload may be committing), or gone (ended, unknown, or a create's
// placeholder past pendingLeaseTTL).
func (s *Server) holderState(ctx context.Context, org, h string, since time.Time) string {
	if strings.HasPrefix(h, pendingLeasePrefix) {
		if time.Since(since) > pendingLeaseTTL {
			return "gone"
		}
		return "live"
	}
	rec, ok := s.index.get(ctx, org, h)
	if !ok {
		return "gone"
	}
	r := s.runnerByID(s.index.runnerOf(rec))
	if r == nil {
		return "gone"
	}
	sb := s.current(ctx, rec, r)
	switch {
	case sb.State.Terminal():
		return "gone"
	case sb.State == runner.StateTerminating:
		return "ending"
	}
	return "live"
}

// waitNotEnding waits (up to globalEndWait) while org's volume id's lease holder is
// ending, so a mount made right after its writer was deleted reads what it wrote.
func (s *Server) waitNotEnding(ctx context.Context, org, id string) error {
	deadline := time.Now().Add(globalEndWait)
	for {
		h, since, err := s.volumes.LeaseHolder(ctx, org, id)
		if err != nil {
			return connect.NewError(connect.CodeUnavailable, err)
		}
		if h == "" || s.holderState(ctx, org, h, since) != "ending" || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(globalPoll):
		}
	}
}

// prepareGlobals plans the GLOBAL volumes sp mounts: each READY, named by one volume of
// sp, the write lease taken for those it mounts read-write (CWSANDBOX_VOLUME_BUSY naming
// the holder when another live sandbox has it), and the committed generation read after.
// nil when sp mounts none. The caller commits or releases the session.
func (s *Server) prepareGlobals(ctx context.Context, org string, sp *sandboxv1.SandboxSpec) (*globalSession, error) {
	if s.volumes == nil || len(registeredVolumeIDs(sp)) == 0 {
		return nil, nil
	}
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	g := &globalSession{s: s, org: org, token: pendingLeasePrefix + hex.EncodeToString(tok[:]), plans: map[string]globalPlan{}}
	names := map[string]string{} // volume ID -> the spec volume naming it
	fail := func(err error) (*globalSession, error) {
		g.release(ctx)
		return nil, err
	}
	for i, v := range sp.GetVolumes() {
		id := v.GetVolumeId()
		if id == "" || !spec.ValidVolumeID(id) {
			continue // conversion names the field
		}
		field := fmt.Sprintf("sandbox.spec.volumes[%d].volume_id", i)
		vol, err := s.readyVolume(ctx, org, field, id)
		if err != nil {
			return fail(err)
		}
		if !isGlobal(vol) {
			continue
		}
		if first, ok := names[id]; ok {
			vs := []apierr.Violation{{Field: field, Description: fmt.Sprintf("GLOBAL volume %q is already mounted as volume %q: name it once", id, first)}}
			return fail(apierr.Invalid(apierr.InvalidRequest, "invalid volumes: "+apierr.Describe(vs), vs))
		}
		names[id] = v.GetName()
		if s.blobs == nil {
			return fail(apierr.New(apierr.VolumeTypeNotSupported, fmt.Sprintf("%s: volume %q is GLOBAL, and this gateway has no blob store", field, id), map[string]string{"volume_id": id}))
		}
		plan := globalPlan{vol: vol, writer: !vol.ReadOnly && writesTo(sp, v.GetName())}
		if err := s.waitNotEnding(ctx, org, id); err != nil {
			return fail(err)
		}
		if plan.writer {
			holder, err := s.volumes.AcquireLease(ctx, org, id, g.token, func(h string, since time.Time) bool {
				return s.holderState(ctx, org, h, since) == "gone"
			})
			if err != nil {
				return fail(connect.NewError(connect.CodeUnavailable, err))
			}
			if holder != "" {
				shown := holder
				if strings.HasPrefix(holder, pendingLeasePrefix) {
					shown = "a sandbox being created"
				}
				return fail(apierr.New(apierr.VolumeBusy, fmt.Sprintf("%s: GLOBAL volume %q is mounted read-write by %s (one writer at a time): mount it read-only, or retry once that sandbox ended",
					field, id, shown), map[string]string{"volume_id": id, "sandbox_id": holder}))
			}
			g.leased = append(g.leased, id)
		}
		m, err := runner.ReadGlobalManifest(ctx, s.blobs, globalPrefix(vol))
		if err != nil {
			return fail(apierr.New(apierr.VolumeNotReady, fmt.Sprintf("%s: GLOBAL volume %q: %v (ValidateVolume checks it again)", field, id, err), map[string]string{"volume_id": id}))
		}
		plan.manifest = m
		g.plans[id] = plan
		g.fields = append(g.fields, field) // one per spec volume: bounded with the spec
		if plan.writer {
			g.writers = append(g.writers, field)
		}
	}
	if len(g.plans) == 0 {
		return nil, nil
	}
	return g, nil
}

// globalRegistered is how a create mounts GLOBAL volume v (its plan from ctx).
func globalRegistered(ctx context.Context, field string, v store.Volume) (spec.RegisteredVolume, error) {
	plans, _ := ctx.Value(globalPlansKey{}).(map[string]globalPlan)
	p, ok := plans[v.ID]
	if !ok {
		return spec.RegisteredVolume{}, apierr.New(apierr.VolumeTypeNotSupported, fmt.Sprintf("%s: volume %q is GLOBAL, which this operation cannot mount", field, v.ID), map[string]string{"volume_id": v.ID})
	}
	size := globalSize(v)
	g := &runtime.GlobalVolume{BlobPrefix: globalPrefix(v), MaxSizeBytes: size}
	if p.writer {
		g.CommitGeneration = p.manifest.Generation + 1
	}
	rv := spec.RegisteredVolume{Global: g, SizeBytes: size, SubPath: v.SubPath, ReadOnly: v.ReadOnly}
	if src, ok := p.manifest.Source(v.ID); ok {
		rv.Restore = &src
	}
	return rv, nil
}

// refuseGlobal refuses to fork a sandbox that mounts a GLOBAL volume (each fork would
// be a second copy of it: a second writer, or a reader the lease knows nothing of), or to
// pause it releasing its resources (its copy would be committed at the checkpoint and
// the resumed sandbox's writes after it lost).
func (s *Server) refuseGlobal(ctx context.Context, rec *record, what string) error {
	if s.volumes == nil {
		return nil
	}
	for _, id := range registeredVolumeIDs(rec.spec) {
		if v, err := s.volumes.Get(ctx, rec.org, id); err == nil && isGlobal(v) {
			return apierr.New(apierr.VolumeTypeNotSupported, fmt.Sprintf("sandbox %s mounts GLOBAL volume %q: %s", rec.id, id, what),
				map[string]string{"volume_id": id})
		}
	}
	return nil
}
