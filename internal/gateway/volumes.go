package gateway

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Registered volumes (VolumeService; docs/volumes.md). This slice builds CLUSTER_LOCAL
// volumes whose runner's backend holds them (runner.VolumeHandle: the local backend's
// managed ext4 images); VolumeSpec.pvc names them: runner_id the runner, namespace
// "default", claim_name the volume on the runner (one per organization and runner),
// sub_path a root inside it. Create stores the volume VALIDATING and has the runner make
// and check it in the background (READY, or ERROR with state_reason); a sandbox mounting
// it is placed on its runner only. Writes need an admin key; any key of the organization
// reads. Another organization's volume is CWSANDBOX_VOLUME_NOT_FOUND.

const (
	// maxVolumesPerOrg bounds an organization's registered volumes.
	maxVolumesPerOrg = 1000
	// maxVolumeDescriptionBytes bounds spec.description.
	maxVolumeDescriptionBytes = 1024
	// maxVolumeSubPathBytes bounds pvc.sub_path.
	maxVolumeSubPathBytes = 1024
	// volumeRunnerTimeout bounds one call to the volume's runner.
	volumeRunnerTimeout = 2 * time.Minute
	// attachedShown is how many attached sandboxes a refused delete names.
	attachedShown = 10
	// DefaultVolumeBytes is a volume's size when spec.size is "" (the local backend's
	// default, local.DefaultManagedVolumeBytes).
	DefaultVolumeBytes int64 = 10 << 30
	// MinVolumeBytes and MaxVolumeBytes bound spec.size (the sandboxd extension): the
	// smallest ext4 image the local backend makes, and 1 TiB.
	MinVolumeBytes int64 = 16 << 20
	MaxVolumeBytes       = runner.MaxRegisteredVolumeBytes
)

// volumeSize parses spec.size (a Kubernetes quantity, a whole number of MiB within
// [MinVolumeBytes, MaxVolumeBytes]); "" is DefaultVolumeBytes.
func volumeSize(q string) (int64, error) {
	if q == "" {
		return DefaultVolumeBytes, nil
	}
	if len(q) > 32 {
		return 0, fmt.Errorf("is %d bytes long: a quantity such as 10Gi", len(q))
	}
	n, err := quantity.ParseMemory(q)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not a quantity: want e.g. 512Mi or 10Gi", q)
	case n < MinVolumeBytes || n > MaxVolumeBytes:
		return 0, fmt.Errorf("%q: must be %s to %s", q, quantityOf(MinVolumeBytes), quantityOf(MaxVolumeBytes))
	case n%(1<<20) != 0:
		return 0, fmt.Errorf("%q: must be a whole number of Mi", q)
	}
	return n, nil
}

// checkVolumePolicySize refuses a registered volume of size bytes on runner runnerID
// when the runner's policy bounds its volumes below that (constraints.volumes.max_size):
// INVALID_ARGUMENT CWSANDBOX_PLACEMENT_REJECTED naming the constraint, with a violation of
// volume.spec.size. Volumes already larger keep their size; they only cannot grow.
func (s *Server) checkVolumePolicySize(ctx context.Context, runnerID string, size int64) error {
	i := slices.IndexFunc(s.runners, func(r runner.Handle) bool { return r.ID() == runnerID })
	if i < 0 {
		return nil // refused elsewhere (unknown runner)
	}
	p, _, err := s.views.policyOf(ctx, i, runnerID)
	if err != nil {
		return apierr.WithRetry(apierr.Newf(apierr.RunnerUnavailable, "the policy of runner %s cannot be read now: %v", runnerID, err), 5*time.Second)
	}
	limit := p.VolumeMaxSize()
	if limit <= 0 || size <= limit {
		return nil
	}
	vs := []apierr.Violation{{Field: "volume.spec.size", Description: fmt.Sprintf("%s is above %s, the largest volume runner %s's policy allows (%s)",
		quantityOf(size), quantityOf(limit), runnerID, policy.ConstraintVolumeMaxSize)}}
	return apierr.Invalid(apierr.PlacementRejected, fmt.Sprintf("runner %s's policy rejects this volume: %s", runnerID, apierr.Describe(vs)), vs)
}

func (s *Server) volumesStore() (store.Volumes, error) {
	if s.volumes == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "registered volumes need the gateway's store")
	}
	return s.volumes, nil
}

func volumeNotFound(id string) error {
	return apierr.New(apierr.VolumeNotFound, fmt.Sprintf("volume %q not found", id), map[string]string{"volume_id": id})
}

func volumeStoreErr(id string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return volumeNotFound(id)
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// registeredVolumeIDs are the registered volumes sp mounts, in order, once each.
func registeredVolumeIDs(sp *sandboxv1.SandboxSpec) []string {
	var out []string
	for _, v := range sp.GetVolumes() {
		if id := v.GetVolumeId(); id != "" && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func hasAny(have, want []string) bool {
	for _, w := range want {
		if slices.Contains(have, w) {
			return true
		}
	}
	return false
}

// attached returns org's sandboxes that have not ended and mount volume id (index order).
func (s *Server) attached(ctx context.Context, org, id string) []string {
	var out []string
	for _, rec := range s.index.list(ctx, org, false) {
		if !slices.Contains(registeredVolumeIDs(rec.spec), id) {
			continue
		}
		if s.index.lastOf(rec).State.Terminal() {
			continue
		}
		out = append(out, rec.id)
	}
	return out
}

func (s *Server) volumeProto(ctx context.Context, v store.Volume) *sandboxv1.Volume {
	st := &sandboxv1.VolumeStatus{
		State:                volumeState(v.State),
		StateReason:          v.StateReason,
		Locality:             sandboxv1.VolumeLocality_VOLUME_LOCALITY_CLUSTER_LOCAL,
		CreateTime:           timestamppb.New(v.CreateTime),
		UpdateTime:           timestamppb.New(v.UpdateTime),
		AccessModes:          []string{"ReadWriteMany"},
		AttachedSandboxCount: int32(len(s.attached(ctx, v.Org, v.ID))),
	}
	if isGlobal(v) {
		// One read-write mount at a time (the write lease), read-only ones anywhere.
		st.Locality = sandboxv1.VolumeLocality_VOLUME_LOCALITY_GLOBAL
		st.AccessModes = []string{"ReadWriteOncePod", "ReadOnlyMany"}
	}
	if v.ReadOnly {
		st.AccessModes = []string{"ReadOnlyMany"}
	}
	if modes := knownAccessModes(v.AccessModes); !isGlobal(v) && len(modes) > 0 && (!v.ReadOnly || singleNode(modes)) {
		// What the runner reported of the claim (a Kubernetes runner's ReadWriteOnce or
		// ReadWriteOncePod pins the sandboxes mounting it to one node, read-only or not).
		st.AccessModes = modes
	}
	if v.LastValidated != nil {
		st.LastValidatedTime = timestamppb.New(*v.LastValidated)
	}
	if v.CapacityBytes > 0 {
		st.Capacity = quantityOf(v.CapacityBytes)
	}
	out := &sandboxv1.Volume{VolumeId: v.ID, Status: st, Spec: &sandboxv1.VolumeSpec{
		Source:      &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: v.RunnerID, Namespace: v.Namespace, ClaimName: v.ClaimName, SubPath: v.SubPath}},
		ReadOnly:    v.ReadOnly,
		Description: v.Description,
	}}
	if v.SizeBytes > 0 {
		out.Spec.Size = quantityOf(v.SizeBytes)
	}
	return out
}

// accessModes are the Kubernetes access modes a runner may report of a volume's claim.
var accessModes = []string{"ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"}

// knownAccessModes keeps the modes of ms that are access modes, once each: what a runner
// reports is not taken on trust.
func knownAccessModes(ms []string) []string {
	var out []string
	for _, m := range ms {
		if slices.Contains(accessModes, m) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// singleNode reports whether modes let one node at a time mount the claim.
func singleNode(modes []string) bool {
	return !slices.Contains(modes, "ReadWriteMany") && !slices.Contains(modes, "ReadOnlyMany")
}

// quantityOf renders n bytes as a Kubernetes quantity ("10Gi"), exact.
func quantityOf(n int64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func volumeState(s string) sandboxv1.VolumeState {
	return sandboxv1.VolumeState(sandboxv1.VolumeState_value["VOLUME_STATE_"+s])
}

func volumeStateName(st sandboxv1.VolumeState) string {
	return strings.TrimPrefix(st.String(), "VOLUME_STATE_")
}

func (v storeVolume) registered() runner.RegisteredVolume {
	return runner.RegisteredVolume{Org: v.Org, ClaimName: v.ClaimName, Namespace: v.Namespace, SizeBytes: v.SizeBytes}
}

type storeVolume store.Volume

// volumeViolations checks a CreateVolume's volume.
func volumeViolations(v *sandboxv1.Volume) []apierr.Violation {
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	if v == nil {
		add("volume", "is required")
		return vs
	}
	if !spec.ValidVolumeID(v.GetVolumeId()) {
		add("volume.volume_id", "must be 1-%d of a-z, 0-9, '-', '_', '.', starting and ending alphanumeric, got %q", spec.MaxVolumeIDBytes, v.GetVolumeId())
	}
	if len(v.GetSpec().GetDescription()) > maxVolumeDescriptionBytes {
		add("volume.spec.description", "is %d bytes, at most %d", len(v.GetSpec().GetDescription()), maxVolumeDescriptionBytes)
	}
	if _, err := volumeSize(v.GetSpec().GetSize()); err != nil {
		add("volume.spec.size", "%v", err)
	}
	pvc := v.GetSpec().GetPvc()
	if pvc == nil {
		add("volume.spec.pvc", "is required (the only volume source)")
		return vs
	}
	if pvc.GetRunnerId() == "" {
		add("volume.spec.pvc.runner_id", "is required")
	}
	if pvc.GetNamespace() == "" {
		add("volume.spec.pvc.namespace", "is required (%q on local runners, the runner's namespace on Kubernetes runners)", runner.VolumeNamespace)
	}
	if !runner.ClaimNamePattern.MatchString(pvc.GetClaimName()) {
		add("volume.spec.pvc.claim_name", "must be a DNS-1123 label (a-z, 0-9, '-', at most 63), got %q", pvc.GetClaimName())
	}
	if sp := pvc.GetSubPath(); len(sp) > maxVolumeSubPathBytes {
		add("volume.spec.pvc.sub_path", "is %d bytes, at most %d", len(sp), maxVolumeSubPathBytes)
	} else if err := runtime.CheckSubPath(sp); err != nil {
		add("volume.spec.pvc.sub_path", "%v", err)
	}
	return vs
}

// CreateVolume registers a volume VALIDATING and has its runner make and check it.
func (s *Server) CreateVolume(ctx context.Context, req *connect.Request[sandboxv1.CreateVolumeRequest]) (*connect.Response[sandboxv1.Volume], error) {
	st, err := s.volumesStore()
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "CreateVolume"); err != nil {
		return nil, err
	}
	p := principal(ctx)
	m := req.Msg
	vs := volumeViolations(m.GetVolume())
	vs = append(vs, requestIDViolations("request_id", m.GetRequestId())...)
	if vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid volume: "+apierr.Describe(vs), vs)
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m.GetVolume())
	sum := sha256.Sum256(b)
	digest := hex.EncodeToString(sum[:])
	if m.GetRequestId() != "" {
		if first, err := st.GetByRequestID(ctx, p.Org, m.GetRequestId()); err == nil {
			if first.RequestDigest != digest {
				rv := []apierr.Violation{{Field: "request_id", Description: "already created a volume from a different request"}}
				return nil, apierr.Invalid(apierr.RequestIDConflict, "request_id conflict: "+apierr.Describe(rv), rv)
			}
			return connect.NewResponse(s.volumeProto(ctx, first)), nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, connect.NewError(connect.CodeUnavailable, err)
		}
	}
	pvc := m.GetVolume().GetSpec().GetPvc()
	if pvc.GetRunnerId() == globalRunnerID {
		if pvc.GetNamespace() != runner.VolumeNamespace {
			return nil, apierr.New(apierr.VolumeRunnerIneligible, fmt.Sprintf("volume.spec.pvc.namespace %q: GLOBAL volumes (runner_id %q) are in namespace %q",
				pvc.GetNamespace(), globalRunnerID, runner.VolumeNamespace), map[string]string{"runner_id": globalRunnerID})
		}
	} else if h := s.runnerByID(pvc.GetRunnerId()); h == nil || !s.servesLoaded(ctx, h, p.Org) {
		// Another organization's runner is as unknown as a missing one: it must not
		// learn of the volume, nor the caller of the runner.
		return nil, apierr.New(apierr.VolumeRunnerIneligible, fmt.Sprintf("volume.spec.pvc.runner_id: no runner %q of this gateway", pvc.GetRunnerId()),
			map[string]string{"runner_id": pvc.GetRunnerId()})
	} else {
		// The runner's namespace (Capacity says it; "default" for an older runner). A
		// runner that does not answer now checks it itself when it validates the volume.
		cctx, cancel := context.WithTimeout(ctx, viewTimeout)
		c, cerr := h.Capacity(cctx)
		cancel()
		if ns := cmp.Or(c.VolumeNamespace, runner.VolumeNamespace); cerr == nil && pvc.GetNamespace() != ns {
			vs := []apierr.Violation{{Field: "volume.spec.pvc.namespace", Description: fmt.Sprintf("must be %q, the namespace of runner %s's volumes", ns, pvc.GetRunnerId())}}
			return nil, apierr.WithViolations(apierr.New(apierr.VolumeRunnerIneligible, fmt.Sprintf("volume.spec.pvc.namespace %q: registered volumes of runner %s are in namespace %q",
				pvc.GetNamespace(), pvc.GetRunnerId(), ns), map[string]string{"runner_id": pvc.GetRunnerId()}), vs)
		}
	}
	size, _ := volumeSize(m.GetVolume().GetSpec().GetSize()) // checked above
	if pvc.GetRunnerId() != globalRunnerID {
		if err := s.checkVolumePolicySize(ctx, pvc.GetRunnerId(), size); err != nil {
			return nil, err
		}
	}
	v, err := st.Create(ctx, store.Volume{Org: p.Org, ID: m.GetVolume().GetVolumeId(), RunnerID: pvc.GetRunnerId(), Namespace: pvc.GetNamespace(),
		ClaimName: pvc.GetClaimName(), SubPath: strings.TrimSuffix(pvc.GetSubPath(), "/"), ReadOnly: m.GetVolume().GetSpec().GetReadOnly(),
		Description: m.GetVolume().GetSpec().GetDescription(), State: "VALIDATING", RequestID: m.GetRequestId(), RequestDigest: digest,
		SizeBytes: size}, maxVolumesPerOrg, s.volumeQuota())
	var dup *store.AlreadyExistsError
	var qe *store.QuotaExceededError
	switch {
	case errors.As(err, &qe):
		return nil, quotaExceeded(qe)
	case errors.Is(err, store.ErrLimitExceeded):
		return nil, apierr.Newf(apierr.InvalidRequest, "the organization has %d volumes, at most %d: delete some first", maxVolumesPerOrg, maxVolumesPerOrg)
	case errors.As(err, &dup) && dup.Key == store.KeyClaimName:
		return nil, apierr.New(apierr.AlreadyExists, fmt.Sprintf("another volume of the organization already names claim %q of runner %s", pvc.GetClaimName(), pvc.GetRunnerId()), nil)
	case errors.As(err, &dup) && dup.Key == store.KeyRequestID:
		// Another replica created this request's volume meanwhile.
		if first, gerr := st.GetByRequestID(ctx, p.Org, m.GetRequestId()); gerr == nil && first.RequestDigest == digest {
			return connect.NewResponse(s.volumeProto(ctx, first)), nil
		}
		rv := []apierr.Violation{{Field: "request_id", Description: "already created a volume from a different request"}}
		return nil, apierr.Invalid(apierr.RequestIDConflict, "request_id conflict: "+apierr.Describe(rv), rv)
	case errors.As(err, &dup):
		return nil, apierr.New(apierr.AlreadyExists, fmt.Sprintf("volume %q already exists", m.GetVolume().GetVolumeId()), map[string]string{"volume_id": m.GetVolume().GetVolumeId()})
	case err != nil:
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	s.log.Info("volume created", "volume", v.ID, "org", v.Org, "runner", v.RunnerID, "size_bytes", v.SizeBytes)
	out := s.volumeProto(ctx, v)
	go s.validateVolume(context.WithoutCancel(ctx), v)
	return connect.NewResponse(out), nil
}

// validateVolume has v's runner make and check it and records the outcome: READY with
// its capacity, or ERROR with the reason.
func (s *Server) validateVolume(ctx context.Context, v store.Volume) store.Volume {
	ctx, cancel := context.WithTimeout(ctx, volumeRunnerTimeout)
	defer cancel()
	state, reason := "READY", ""
	var capacity int64
	var modes []string
	r := s.runnerByID(v.RunnerID)
	h, ok := r.(runner.VolumeHandle)
	switch {
	case isGlobal(v):
		state, reason, capacity = s.validateGlobal(ctx, v)
	case r == nil || !s.serves(r, v.Org):
		state, reason = "ERROR", fmt.Sprintf("runner %s is not known to this gateway", v.RunnerID)
	case !ok:
		state, reason = "ERROR", fmt.Sprintf("runner %s holds no registered volumes", v.RunnerID)
	default:
		vs, err := h.EnsureVolume(ctx, storeVolume(v).registered())
		if err != nil {
			state, reason = "ERROR", err.Error()
		}
		capacity, modes = vs.CapacityBytes, knownAccessModes(vs.AccessModes)
	}
	now := time.Now()
	u := store.VolumeUpdate{State: &state, StateReason: &reason, LastValidated: &now}
	if capacity > 0 {
		u.CapacityBytes = &capacity
	}
	if state == "READY" && !isGlobal(v) {
		u.AccessModes = &modes
	}
	nv, err := s.volumes.Update(ctx, v.Org, v.ID, u)
	if err != nil {
		s.log.Warn("volume validation not recorded", "volume", v.ID, "org", v.Org, "err", err)
		return v
	}
	s.log.Info("volume validated", "volume", v.ID, "org", v.Org, "state", state, "reason", reason)
	return nv
}

// GetVolume returns one of the organization's volumes.
func (s *Server) GetVolume(ctx context.Context, req *connect.Request[sandboxv1.GetVolumeRequest]) (*connect.Response[sandboxv1.Volume], error) {
	st, err := s.volumesStore()
	if err != nil {
		return nil, err
	}
	id := req.Msg.GetVolumeId()
	if id == "" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "volume_id is required", []apierr.Violation{{Field: "volume_id", Description: "is required"}})
	}
	v, err := st.Get(ctx, principal(ctx).Org, id)
	if err != nil {
		return nil, volumeStoreErr(id, err)
	}
	return connect.NewResponse(s.volumeProto(ctx, v)), nil
}

// ListVolumes pages through the organization's volumes.
func (s *Server) ListVolumes(ctx context.Context, req *connect.Request[sandboxv1.ListVolumesRequest]) (*connect.Response[sandboxv1.ListVolumesResponse], error) {
	st, err := s.volumesStore()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	size, err := apierr.PageSize(m.GetPageSize(), defaultPageSize, maxPageSize)
	if err != nil {
		return nil, err
	}
	var f store.VolumeFilter
	for i, x := range m.GetStates() {
		if x == sandboxv1.VolumeState_VOLUME_STATE_UNSPECIFIED || sandboxv1.VolumeState_name[int32(x)] == "" {
			vs := []apierr.Violation{{Field: fmt.Sprintf("states[%d]", i), Description: fmt.Sprintf("unknown volume state %v", x)}}
			return nil, apierr.Invalid(apierr.InvalidRequest, "invalid states: "+apierr.Describe(vs), vs)
		}
		f.States = append(f.States, volumeStateName(x))
	}
	f.RunnerIDs = m.GetRunnerIds()
	if len(f.States) > 16 || len(f.RunnerIDs) > 100 {
		return nil, apierr.Newf(apierr.InvalidRequest, "at most 16 states and 100 runner_ids")
	}
	vols, next, err := st.List(ctx, principal(ctx).Org, f, store.Page{Size: size, Token: m.GetPageToken()})
	if errors.Is(err, store.ErrInvalid) {
		return nil, badPageToken()
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	out := &sandboxv1.ListVolumesResponse{NextPageToken: next}
	for _, v := range vols {
		out.Volumes = append(out.Volumes, s.volumeProto(ctx, v))
	}
	return connect.NewResponse(out), nil
}

// UpdateVolume changes spec.description and grows spec.size (the sandboxd extension):
// the growth is admitted against max_volume_bytes, then the runner grows the volume
// (online); a runner that cannot puts the size back and the call fails.
func (s *Server) UpdateVolume(ctx context.Context, req *connect.Request[sandboxv1.UpdateVolumeRequest]) (*connect.Response[sandboxv1.Volume], error) {
	st, err := s.volumesStore()
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "UpdateVolume"); err != nil {
		return nil, err
	}
	m := req.Msg
	id := m.GetVolumeId()
	var vs []apierr.Violation
	if id == "" {
		vs = append(vs, apierr.Violation{Field: "volume_id", Description: "is required"})
	}
	if m.GetVolume() == nil {
		vs = append(vs, apierr.Violation{Field: "volume", Description: "is required"})
	}
	if b := m.GetVolume().GetVolumeId(); b != "" && b != id {
		vs = append(vs, apierr.Violation{Field: "volume.volume_id", Description: fmt.Sprintf("is %q, not the volume_id %q being updated", b, id)})
	}
	paths := m.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		paths = []string{"spec.description"}
	}
	setDesc, setSize := false, false
	for i, p := range paths {
		switch p {
		case "spec.description":
			setDesc = true
		case "spec.size":
			setSize = true
		default:
			vs = append(vs, apierr.Violation{Field: fmt.Sprintf("update_mask.paths[%d]", i), Description: fmt.Sprintf("%q cannot be updated: only spec.description and spec.size can", p)})
		}
	}
	desc := m.GetVolume().GetSpec().GetDescription()
	if len(desc) > maxVolumeDescriptionBytes {
		vs = append(vs, apierr.Violation{Field: "volume.spec.description", Description: fmt.Sprintf("is %d bytes, at most %d", len(desc), maxVolumeDescriptionBytes)})
	}
	var size int64
	if setSize {
		if m.GetVolume().GetSpec().GetSize() == "" {
			vs = append(vs, apierr.Violation{Field: "volume.spec.size", Description: "is required with update_mask spec.size"})
		} else if size, err = volumeSize(m.GetVolume().GetSpec().GetSize()); err != nil {
			vs = append(vs, apierr.Violation{Field: "volume.spec.size", Description: err.Error()})
		}
	}
	if vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid update: "+apierr.Describe(vs), vs)
	}
	org := principal(ctx).Org
	var v store.Volume
	if setSize {
		if v, err = s.growVolume(ctx, st, org, id, size); err != nil {
			return nil, err
		}
	}
	if setDesc {
		if v, err = st.Update(ctx, org, id, store.VolumeUpdate{Description: &desc}); err != nil {
			return nil, volumeStoreErr(id, err)
		}
	}
	return connect.NewResponse(s.volumeProto(ctx, v)), nil
}

// growVolume grows org's volume id to size: admitted against max_volume_bytes in the
// store (Resize), then made on the runner; a runner that fails puts the size back. A
// volume that is not READY is refused (CWSANDBOX_VOLUME_NOT_READY); size below the
// current one is INVALID_ARGUMENT; the same size changes nothing.
func (s *Server) growVolume(ctx context.Context, st store.Volumes, org, id string, size int64) (store.Volume, error) {
	cur, err := st.Get(ctx, org, id)
	if err != nil {
		return cur, volumeStoreErr(id, err)
	}
	if cur.State != "READY" {
		return cur, apierr.New(apierr.VolumeNotReady, fmt.Sprintf("volume %q is %s: only a READY volume grows", id, cur.State), map[string]string{"volume_id": id})
	}
	if size == cur.SizeBytes {
		return cur, nil
	}
	if size > cur.SizeBytes && !isGlobal(cur) {
		if err := s.checkVolumePolicySize(ctx, cur.RunnerID, size); err != nil {
			return cur, err
		}
	}
	before, after, err := st.Resize(ctx, org, id, size, s.volumeQuota())
	var qe *store.QuotaExceededError
	switch {
	case errors.As(err, &qe):
		return cur, quotaExceeded(qe)
	case errors.Is(err, store.ErrInvalid):
		vs := []apierr.Violation{{Field: "volume.spec.size", Description: fmt.Sprintf("a volume only grows: it is %s, %s is smaller", quantityOf(cur.SizeBytes), quantityOf(size))}}
		return cur, apierr.Invalid(apierr.InvalidRequest, "invalid update: "+apierr.Describe(vs), vs)
	case err != nil:
		return cur, volumeStoreErr(id, err)
	}
	// undo puts the size back, compare-and-set: only while it is still the size this
	// grow set (another grow, on another replica perhaps, may have changed it since:
	// that one stands).
	undo := func() {
		old, mine := before.SizeBytes, after.SizeBytes
		_, err := st.Update(context.WithoutCancel(ctx), org, id, store.VolumeUpdate{SizeBytes: &old, IfSizeBytes: &mine})
		switch {
		case errors.Is(err, store.ErrConflict):
			s.log.Info("volume grow: size not put back, changed meanwhile", "volume", id, "org", org)
		case err != nil:
			s.log.Warn("volume grow: size not put back", "volume", id, "org", org, "err", err)
		}
	}
	if isGlobal(after) {
		// Nothing to grow on a runner: the next copies are made at the new size (the
		// copies mounted now keep theirs).
		n := globalSize(after)
		s.log.Info("volume grown", "volume", id, "org", org, "from_bytes", before.SizeBytes, "size_bytes", size)
		if out, err := st.Update(ctx, org, id, store.VolumeUpdate{CapacityBytes: &n}); err == nil {
			return out, nil
		}
		return after, nil
	}
	h, ok := s.runnerByID(after.RunnerID).(runner.VolumeHandle)
	if ok && !s.servesLoaded(ctx, s.runnerByID(after.RunnerID), org) {
		ok = false // its runner now belongs to another organization: nothing goes to it
	}
	if !ok {
		undo()
		return cur, apierr.New(apierr.VolumeRunnerIneligible, fmt.Sprintf("volume %q: runner %s is not reachable from this gateway, or holds no volumes", id, after.RunnerID),
			map[string]string{"volume_id": id, "runner_id": after.RunnerID})
	}
	rctx, cancel := context.WithTimeout(ctx, volumeRunnerTimeout)
	vs, err := h.EnsureVolume(rctx, storeVolume(after).registered())
	cancel()
	n, modes := vs.CapacityBytes, knownAccessModes(vs.AccessModes)
	if err == nil && n < size {
		err = apierr.Newf(apierr.InvalidRequest, "volume %q: the runner grew it to %d bytes only, not %d", id, n, size)
	}
	if err != nil {
		undo()
		s.log.Warn("volume grow failed", "volume", id, "org", org, "size_bytes", size, "err", err)
		return cur, err
	}
	s.log.Info("volume grown", "volume", id, "org", org, "from_bytes", before.SizeBytes, "size_bytes", size)
	// The capacity this grow saw, unless another grow changed the size since (its
	// capacity is the newer one).
	mine := after.SizeBytes
	out, err := st.Update(ctx, org, id, store.VolumeUpdate{CapacityBytes: &n, AccessModes: &modes, IfSizeBytes: &mine})
	if err != nil {
		return after, nil
	}
	return out, nil
}

// DeleteVolume removes a volume and its data on its runner; refused while live sandboxes
// mount it unless force.
func (s *Server) DeleteVolume(ctx context.Context, req *connect.Request[sandboxv1.DeleteVolumeRequest]) (*connect.Response[sandboxv1.Volume], error) {
	st, err := s.volumesStore()
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "DeleteVolume"); err != nil {
		return nil, err
	}
	m := req.Msg
	id := m.GetVolumeId()
	if id == "" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "volume_id is required", []apierr.Violation{{Field: "volume_id", Description: "is required"}})
	}
	org := principal(ctx).Org
	v, err := st.Get(ctx, org, id)
	if errors.Is(err, store.ErrNotFound) && m.GetAllowMissing() {
		return connect.NewResponse(&sandboxv1.Volume{VolumeId: id}), nil
	}
	if err != nil {
		return nil, volumeStoreErr(id, err)
	}
	if users := s.attached(ctx, org, id); len(users) > 0 && !m.GetForce() {
		shown := users
		if len(shown) > attachedShown {
			shown = shown[:attachedShown]
		}
		return nil, apierr.New(apierr.VolumeInUse, fmt.Sprintf("volume %q is mounted by %d live sandboxes (%s): delete them first, or force",
			id, len(users), strings.Join(shown, ", ")), map[string]string{"volume_id": id, "sandbox_ids": strings.Join(shown, ",")})
	}
	deleting := "DELETING"
	empty := ""
	if nv, err := st.Update(ctx, org, id, store.VolumeUpdate{State: &deleting, StateReason: &empty}); err == nil {
		v = nv
	}
	if isGlobal(v) {
		if err := s.deleteGlobal(ctx, v); err != nil {
			ready, reason := "ERROR", "delete failed: "+err.Error()
			_, _ = st.Update(context.WithoutCancel(ctx), org, id, store.VolumeUpdate{State: &ready, StateReason: &reason})
			return nil, err
		}
	} else if h, ok := s.runnerByID(v.RunnerID).(runner.VolumeHandle); ok && s.servesLoaded(ctx, s.runnerByID(v.RunnerID), org) {
		// (A runner that now belongs to another organization is sent nothing.)
		rctx, cancel := context.WithTimeout(ctx, volumeRunnerTimeout)
		err := h.DeleteVolume(rctx, storeVolume(v).registered(), m.GetForce())
		cancel()
		// A runner that holds no volumes has nothing to delete.
		if err != nil && apierr.Reason(err) != apierr.VolumeTypeNotSupported {
			// Still there: back to what it was, so a retry sees it.
			ready, reason := "ERROR", "delete failed: "+err.Error()
			_, _ = st.Update(context.WithoutCancel(ctx), org, id, store.VolumeUpdate{State: &ready, StateReason: &reason})
			return nil, err
		}
	}
	out := s.volumeProto(ctx, v)
	if _, err := st.Delete(ctx, org, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	s.log.Info("volume deleted", "volume", id, "org", org, "force", m.GetForce())
	return connect.NewResponse(out), nil
}

// ValidateVolume checks the volume again on its runner and returns the outcome.
func (s *Server) ValidateVolume(ctx context.Context, req *connect.Request[sandboxv1.ValidateVolumeRequest]) (*connect.Response[sandboxv1.Volume], error) {
	st, err := s.volumesStore()
	if err != nil {
		return nil, err
	}
	id := req.Msg.GetVolumeId()
	if id == "" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "volume_id is required", []apierr.Violation{{Field: "volume_id", Description: "is required"}})
	}
	v, err := st.Get(ctx, principal(ctx).Org, id)
	if err != nil {
		return nil, volumeStoreErr(id, err)
	}
	if v.State == "DELETING" {
		return nil, apierr.New(apierr.VolumeNotReady, fmt.Sprintf("volume %q is being deleted", id), map[string]string{"volume_id": id})
	}
	v = s.validateVolume(ctx, v)
	return connect.NewResponse(s.volumeProto(ctx, v)), nil
}

// registeredResolver resolves org's registered volumes for spec.Convert: READY ones only.
func (s *Server) registeredResolver(ctx context.Context, org string) spec.RegisteredResolver {
	if s.volumes == nil {
		return nil
	}
	return func(field, id string) (spec.RegisteredVolume, error) {
		v, err := s.readyVolume(ctx, org, field, id)
		if err != nil {
			return spec.RegisteredVolume{}, err
		}
		if isGlobal(v) {
			return globalRegistered(ctx, field, v)
		}
		return spec.RegisteredVolume{Managed: storeVolume(v).registered().ManagedName(), SubPath: v.SubPath, ReadOnly: v.ReadOnly}, nil
	}
}

func (s *Server) readyVolume(ctx context.Context, org, field, id string) (store.Volume, error) {
	v, err := s.volumes.Get(ctx, org, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			vs := []apierr.Violation{{Field: field, Description: fmt.Sprintf("no volume %q", id)}}
			return v, apierr.WithViolations(apierr.New(apierr.VolumeNotFound, fmt.Sprintf("%s: volume %q not found", field, id), map[string]string{"volume_id": id}), vs)
		}
		return v, connect.NewError(connect.CodeUnavailable, err)
	}
	if v.State != "READY" {
		why := v.State
		if v.StateReason != "" {
			why += ": " + v.StateReason
		}
		return v, apierr.New(apierr.VolumeNotReady, fmt.Sprintf("%s: volume %q is not READY (%s)", field, id, why), map[string]string{"volume_id": id})
	}
	return v, nil
}

// pinToVolumes returns sp pinned (runner_ids) to the runner of the CLUSTER_LOCAL volumes
// it mounts: they must be READY, all of one runner, and that runner one of sp's
// runner_ids when it names any (CWSANDBOX_VOLUME_PLACEMENT_CONFLICT naming the volume).
func (s *Server) pinToVolumes(ctx context.Context, org string, sp *sandboxv1.SandboxSpec) (*sandboxv1.SandboxSpec, error) {
	ids := registeredVolumeIDs(sp)
	if len(ids) == 0 || s.volumes == nil {
		return sp, nil // without a store, conversion says NOT_IMPLEMENTED
	}
	runnerID, first := "", ""
	for i, v := range sp.GetVolumes() {
		if v.GetVolumeId() == "" {
			continue
		}
		if !spec.ValidVolumeID(v.GetVolumeId()) {
			return sp, nil // conversion names the field
		}
		vol, err := s.readyVolume(ctx, org, fmt.Sprintf("sandbox.spec.volumes[%d].volume_id", i), v.GetVolumeId())
		if err != nil {
			return nil, err
		}
		switch {
		case isGlobal(vol):
			continue // any runner mounts it
		case runnerID == "":
			runnerID, first = vol.RunnerID, vol.ID
		case runnerID != vol.RunnerID:
			return nil, apierr.New(apierr.VolumePlacementConflict, fmt.Sprintf("volumes %q (runner %s) and %q (runner %s) are CLUSTER_LOCAL to different runners: no runner can mount both",
				first, runnerID, vol.ID, vol.RunnerID), map[string]string{"volume_id": vol.ID})
		}
	}
	if runnerID == "" {
		return sp, nil // GLOBAL volumes only
	}
	if want := sp.GetRunnerIds(); len(want) > 0 && !slices.Contains(want, runnerID) {
		return nil, apierr.New(apierr.VolumePlacementConflict, fmt.Sprintf("volume %q is CLUSTER_LOCAL to runner %s, which sandbox.spec.runner_ids (%s) excludes",
			first, runnerID, strings.Join(want, ", ")), map[string]string{"volume_id": first, "runner_id": runnerID})
	}
	out := proto.CloneOf(sp)
	out.RunnerIds = []string{runnerID}
	return out, nil
}
