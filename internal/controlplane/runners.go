package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/maintenance"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Identifier formats.
var (
	// runner_id is a DNS label: it appears in endpoint host names.
	runnerIDPattern = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)
	// cluster_id: a UUID, or any name of letters, digits, '.', '_' and '-'.
	clusterIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// zone: lowercase, e.g. us-east-04a.
	zonePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,62})$`)
	// runner_group_id: like runner_id, digits allowed first.
	groupPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

const maxDisplayName = 256

type violations []apierr.Violation

func (v *violations) add(field, format string, args ...any) {
	*v = append(*v, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
}

func (v violations) err(msg string) error {
	if len(v) == 0 {
		return nil
	}
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = x.Field + " " + x.Description
	}
	return apierr.Invalid(apierr.InvalidRequest, msg+": "+strings.Join(parts, "; "), v)
}

func checkRunnerID(vs *violations, field, id string) {
	switch {
	case id == "":
		vs.add(field, "is required")
	case !runnerIDPattern.MatchString(id):
		vs.add(field, "must be 1-63 lowercase letters, digits or '-', start with a letter and not end with '-' (got %q)", id)
	}
}

// ReservedRunnerIDPrefix begins the runner IDs only the platform organization may
// create. Runner IDs are unique across organizations and first come, first served
// (they name endpoint hosts and certificates platform-wide), so without it a tenant could
// take the name the operator means to give a platform runner.
const ReservedRunnerIDPrefix = "platform-"

// checkReservedRunnerID refuses org a runner ID of the reserved prefix unless org is the
// platform's: PERMISSION_DENIED CWSANDBOX_RUNNER_ID_RESERVED naming
// managed_runner.runner_id.
func (s *Service) checkReservedRunnerID(org, id string) error {
	if !strings.HasPrefix(id, ReservedRunnerIDPrefix) || org == s.platform {
		return nil
	}
	msg := fmt.Sprintf("runner IDs beginning %q are reserved for the platform organization's runners", ReservedRunnerIDPrefix)
	return apierr.WithViolations(apierr.New(apierr.RunnerIDReserved, msg+"; choose another runner_id", nil),
		[]apierr.Violation{{Field: "managed_runner.runner_id", Description: fmt.Sprintf("%s (got %q)", msg, id)}})
}

func checkGroup(vs *violations, field, g string) {
	if g != "" && !groupPattern.MatchString(g) {
		vs.add(field, "must be 1-63 lowercase letters, digits or '-' and not start or end with '-' (got %q)", g)
	}
}

func checkDisplayName(vs *violations, field, n string) {
	if len(n) > maxDisplayName {
		vs.add(field, "must be at most %d bytes (got %d)", maxDisplayName, len(n))
	}
}

func channelName(vs *violations, field string, c controlplanev1.ReleaseChannel) string {
	switch c {
	case controlplanev1.ReleaseChannel_RELEASE_CHANNEL_UNSPECIFIED, controlplanev1.ReleaseChannel_STABLE:
		return store.ChannelStable
	case controlplanev1.ReleaseChannel_RAPID:
		return store.ChannelRapid
	}
	vs.add(field, "must be STABLE or RAPID (got %d)", int32(c))
	return ""
}

// policyJSON validates the policy of a request and returns it as a JSON document.
func policyJSON(vs *violations, field string, p *structpb.Struct) json.RawMessage {
	if p == nil {
		vs.add(field, "is required ({} is the permissive policy)")
		return nil
	}
	b, err := protojson.Marshal(p)
	if err != nil {
		vs.add(field, "cannot be encoded: %v", err)
		return nil
	}
	doc, err := policy.Parse(b)
	if err != nil {
		vs.add(field, "%v", err)
		return nil
	}
	prefix := field[:len(field)-len("policy")]
	for _, v := range policy.Validate(doc) {
		vs.add(prefix+v.Field, "%s", v.Description)
	}
	return b
}

// maintenanceJSON validates a maintenance policy and returns it as the store keeps it:
// nil for none (or an empty one: any time).
func maintenanceJSON(vs *violations, field string, p *controlplanev1.MaintenancePolicy) json.RawMessage {
	mp, ok := maintenanceFromProto(vs, field, p)
	if !ok || mp.Empty() {
		return nil
	}
	for _, v := range maintenance.Validate(mp) {
		vs.add(field+"."+v.Field, "%s", v.Description)
	}
	b, err := json.Marshal(mp)
	if err != nil {
		vs.add(field, "cannot be encoded: %v", err)
		return nil
	}
	return b
}

func maintenanceFromProto(vs *violations, field string, p *controlplanev1.MaintenancePolicy) (maintenance.Policy, bool) {
	var mp maintenance.Policy
	ok := true
	for _, w := range p.GetWindows() {
		mp.Windows = append(mp.Windows, maintenance.Window{Cron: w.GetCron(), DurationSeconds: w.GetDurationSeconds()})
	}
	ts := func(f string, t interface {
		CheckValid() error
		AsTime() time.Time
	}, present bool) time.Time {
		if !present {
			return time.Time{}
		}
		if err := t.CheckValid(); err != nil {
			vs.add(f, "%v", err)
			ok = false
			return time.Time{}
		}
		return t.AsTime().UTC()
	}
	for i, e := range p.GetExclusions() {
		f := fmt.Sprintf("%s.exclusions[%d]", field, i)
		mp.Exclusions = append(mp.Exclusions, maintenance.Exclusion{
			Start:  ts(f+".start_time", e.GetStartTime(), e.GetStartTime() != nil),
			End:    ts(f+".end_time", e.GetEndTime(), e.GetEndTime() != nil),
			Reason: e.GetReason(),
		})
	}
	return mp, ok
}

// maintenanceProto is the stored policy as the API returns it (nil for none).
func maintenanceProto(b json.RawMessage) *controlplanev1.MaintenancePolicy {
	if b == nil {
		return nil
	}
	var mp maintenance.Policy
	if err := json.Unmarshal(b, &mp); err != nil || mp.Empty() {
		return nil
	}
	out := &controlplanev1.MaintenancePolicy{}
	for _, w := range mp.Windows {
		out.Windows = append(out.Windows, &controlplanev1.MaintenanceWindow{Cron: w.Cron, DurationSeconds: w.DurationSeconds})
	}
	for _, e := range mp.Exclusions {
		out.Exclusions = append(out.Exclusions, &controlplanev1.MaintenanceExclusion{
			StartTime: timestamppb.New(e.Start), EndTime: timestamppb.New(e.End), Reason: e.Reason})
	}
	return out
}

// ValidateCreate checks a runner to create and returns its store record (without org).
func ValidateCreate(r *controlplanev1.ManagedRunner) (store.Runner, error) {
	var vs violations
	if r == nil {
		vs.add("managed_runner", "is required")
		return store.Runner{}, vs.err("managed_runner is required")
	}
	checkRunnerID(&vs, "managed_runner.runner_id", r.GetRunnerId())
	switch c := r.GetClusterId(); {
	case c == "":
		vs.add("managed_runner.cluster_id", "is required")
	case !clusterIDPattern.MatchString(c):
		vs.add("managed_runner.cluster_id", "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit (got %q)", c)
	}
	switch z := r.GetZone(); {
	case z == "":
		vs.add("managed_runner.zone", "is required")
	case !zonePattern.MatchString(z):
		vs.add("managed_runner.zone", "must be lowercase letters, digits and '-', e.g. us-east-04a (got %q)", z)
	}
	checkGroup(&vs, "managed_runner.runner_group_id", r.GetRunnerGroupId())
	checkDisplayName(&vs, "managed_runner.display_name", r.GetDisplayName())
	ch := channelName(&vs, "managed_runner.release_channel", r.GetReleaseChannel())
	doc := policyJSON(&vs, "managed_runner.policy", r.GetPolicy())
	mp := maintenanceJSON(&vs, "managed_runner.maintenance_policy", r.GetMaintenancePolicy())
	if err := vs.err("invalid managed runner"); err != nil {
		return store.Runner{}, err
	}
	return store.Runner{RunnerID: r.GetRunnerId(), ClusterID: r.GetClusterId(), Zone: r.GetZone(),
		RunnerGroupID: r.GetRunnerGroupId(), DisplayName: r.GetDisplayName(), ReleaseChannel: ch, Policy: doc,
		MaintenancePolicy: mp}, nil
}

// maskPaths accepts proto and JSON spellings of the update mask's paths.
var maskPaths = map[string]string{
	"policy": "policy", "display_name": "display_name", "displayName": "display_name",
	"runner_group_id": "runner_group_id", "runnerGroupId": "runner_group_id",
	"release_channel": "release_channel", "releaseChannel": "release_channel",
	"maintenance_policy": "maintenance_policy", "maintenancePolicy": "maintenance_policy",
}

var immutablePaths = map[string]bool{
	"runner_id": true, "runnerId": true, "cluster_id": true, "clusterId": true, "zone": true,
}

// ValidateUpdate checks an update request and returns the store update.
func ValidateUpdate(req *controlplanev1.UpdateManagedRunnerRequest) (store.RunnerUpdate, error) {
	var vs violations
	r := req.GetManagedRunner()
	if r == nil {
		vs.add("managed_runner", "is required")
		return store.RunnerUpdate{}, vs.err("managed_runner is required")
	}
	checkRunnerID(&vs, "managed_runner.runner_id", r.GetRunnerId())
	var u store.RunnerUpdate
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		vs.add("update_mask", "is required: name the fields to change (policy, display_name, runner_group_id, release_channel, maintenance_policy)")
	}
	for _, p := range paths {
		switch maskPaths[p] {
		case "policy":
			if r.GetPolicy() == nil {
				vs.add("managed_runner.policy", "is required when update_mask names policy: a policy can be replaced ({} is the permissive policy) but not unset")
				continue
			}
			u.Policy = policyJSON(&vs, "managed_runner.policy", r.GetPolicy())
		case "display_name":
			checkDisplayName(&vs, "managed_runner.display_name", r.GetDisplayName())
			u.DisplayName = new(r.GetDisplayName())
		case "runner_group_id":
			g := r.GetRunnerGroupId()
			checkGroup(&vs, "managed_runner.runner_group_id", g)
			if g == "" {
				g = store.DefaultRunnerGroup
			}
			u.RunnerGroupID = &g
		case "release_channel":
			ch := channelName(&vs, "managed_runner.release_channel", r.GetReleaseChannel())
			u.ReleaseChannel = &ch
		case "maintenance_policy":
			// Replaces the whole policy; absent (or empty) clears it: any time.
			u.SetMaintenancePolicy = true
			u.MaintenancePolicy = maintenanceJSON(&vs, "managed_runner.maintenance_policy", r.GetMaintenancePolicy())
		default:
			if immutablePaths[p] {
				vs.add("update_mask", "%s cannot be changed: delete the runner and create it again", p)
			} else {
				vs.add("update_mask", "unknown path %q: use policy, display_name, runner_group_id, release_channel or maintenance_policy", p)
			}
		}
	}
	if err := vs.err("invalid update"); err != nil {
		return store.RunnerUpdate{}, err
	}
	return u, nil
}

func (s *Service) CreateManagedRunner(ctx context.Context, req *connect.Request[controlplanev1.CreateManagedRunnerRequest]) (*connect.Response[controlplanev1.ManagedRunner], error) {
	rec, err := ValidateCreate(req.Msg.GetManagedRunner())
	if err != nil {
		return nil, err
	}
	rec.Org = principal(ctx).Org
	if err := s.checkReservedRunnerID(rec.Org, rec.RunnerID); err != nil {
		return nil, err
	}
	targets, err := s.channelTargets(ctx) // before the write: a create that succeeds answers
	if err != nil {
		return nil, err
	}
	out, err := s.st.Runners().Create(ctx, rec)
	if err != nil {
		return nil, runnerErr(rec.RunnerID, rec.ClusterID, err)
	}
	s.log.Info("runner created", "org", rec.Org, "runner", rec.RunnerID, "cluster", rec.ClusterID)
	// A runner of a registered cluster is installed by the control plane; if the record
	// cannot be written the runner stays (self-managed) and the call says why.
	if _, err := s.beginInstall(ctx, out); err != nil {
		return nil, apierr.Newf(apierr.ControlPlaneUnavailable, "runner %s was created but its install into cluster %s could not start: %v; delete it and create it again",
			rec.RunnerID, rec.ClusterID, err)
	}
	return s.withHalts(ctx, targets, rec.Org, s.withInstall(ctx, s.toProto(ctx, out, targets), rec.Org))
}

func (s *Service) GetManagedRunner(ctx context.Context, req *connect.Request[controlplanev1.GetManagedRunnerRequest]) (*connect.Response[controlplanev1.ManagedRunner], error) {
	var vs violations
	checkRunnerID(&vs, "runner_id", req.Msg.GetRunnerId())
	if err := vs.err("invalid runner_id"); err != nil {
		return nil, err
	}
	r, err := s.st.Runners().Get(ctx, principal(ctx).Org, req.Msg.GetRunnerId())
	if err != nil {
		return nil, runnerErr(req.Msg.GetRunnerId(), "", err)
	}
	targets, err := s.channelTargets(ctx)
	if err != nil {
		return nil, err
	}
	return s.withHalts(ctx, targets, r.Org, s.withInstall(ctx, s.toProto(ctx, r, targets), r.Org))
}

func (s *Service) ListManagedRunners(ctx context.Context, req *connect.Request[controlplanev1.ListManagedRunnersRequest]) (*connect.Response[controlplanev1.ListManagedRunnersResponse], error) {
	size, err := apierr.PageSize(req.Msg.GetPageSize(), store.DefaultPageSize, store.MaxPageSize)
	if err != nil {
		return nil, err
	}
	rs, next, err := s.st.Runners().List(ctx, principal(ctx).Org, store.Page{Size: size, Token: req.Msg.GetPageToken()})
	if errors.Is(err, store.ErrInvalid) {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid page_token", []apierr.Violation{{Field: "page_token", Description: "is not a token this list returned"}})
	}
	if err != nil {
		return nil, runnerErr("", "", err)
	}
	targets, err := s.channelTargets(ctx)
	if err != nil {
		return nil, err
	}
	out := &controlplanev1.ListManagedRunnersResponse{NextPageToken: next}
	for _, r := range rs {
		out.ManagedRunners = append(out.ManagedRunners, s.withInstall(ctx, s.toProto(ctx, r, targets), r.Org))
	}
	if _, err := s.withHalts(ctx, targets, principal(ctx).Org, out.ManagedRunners...); err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

func (s *Service) UpdateManagedRunner(ctx context.Context, req *connect.Request[controlplanev1.UpdateManagedRunnerRequest]) (*connect.Response[controlplanev1.ManagedRunner], error) {
	u, err := ValidateUpdate(req.Msg)
	if err != nil {
		return nil, err
	}
	org, id := principal(ctx).Org, req.Msg.GetManagedRunner().GetRunnerId()
	targets, err := s.channelTargets(ctx)
	if err != nil {
		return nil, err
	}
	out, err := s.update(ctx, org, id, req.Msg.GetManagedRunner().GetEtag(), u)
	if err != nil {
		return nil, err
	}
	s.log.Info("runner updated", "org", org, "runner", id, "mask", req.Msg.GetUpdateMask().GetPaths(), "policy_revision", out.PolicyRevision)
	return s.withHalts(ctx, targets, org, s.withInstall(ctx, s.toProto(ctx, out, targets), org))
}

// update writes u pinned to etag, or to the current version when etag is "" (retrying a
// few times if a concurrent write gets in between).
func (s *Service) update(ctx context.Context, org, id, etag string, u store.RunnerUpdate) (store.Runner, error) {
	for attempt := 0; ; attempt++ {
		pin := etag
		if pin == "" {
			cur, err := s.st.Runners().Get(ctx, org, id)
			if err != nil {
				return store.Runner{}, runnerErr(id, "", err)
			}
			pin = cur.Etag
		}
		out, err := s.st.Runners().Update(ctx, org, id, pin, u)
		if err == nil {
			return out, nil
		}
		if etag == "" && errors.Is(err, store.ErrConflict) && attempt < 3 {
			continue
		}
		return store.Runner{}, runnerErr(id, "", err)
	}
}

func (s *Service) DeleteManagedRunner(ctx context.Context, req *connect.Request[controlplanev1.DeleteManagedRunnerRequest]) (*connect.Response[emptypb.Empty], error) {
	var vs violations
	checkRunnerID(&vs, "runner_id", req.Msg.GetRunnerId())
	if err := vs.err("invalid runner_id"); err != nil {
		return nil, err
	}
	org, id, etag := principal(ctx).Org, req.Msg.GetRunnerId(), req.Msg.GetEtag()
	cur, err := s.st.Runners().Get(ctx, org, id)
	if err != nil {
		return nil, runnerErr(id, "", err)
	}
	if etag != "" && etag != cur.Etag {
		return nil, runnerErr(id, "", store.ErrConflict)
	}
	if !req.Msg.GetForce() {
		n, err := s.live(ctx, org, id)
		if err != nil {
			return nil, apierr.Newf(apierr.ControlPlaneUnavailable, "cannot count the sandboxes of runner %s: %v", id, err)
		}
		if n > 0 {
			return nil, apierr.New(apierr.RunnerInUse,
				fmt.Sprintf("runner %s owns %d live sandbox(es): delete them first, or delete with force (they are not stopped)", id, n),
				map[string]string{"runner_id": id, "live_sandboxes": strconv.Itoa(n)})
		}
	}
	// A runner the control plane installed is uninstalled first (its sandboxes' Pods are in
	// its namespace and go with it). If that fails the runner stays, so nothing is left
	// behind unnoticed; with force it is deleted anyway and the failure logged.
	in, err := s.st.Installs().Get(ctx, org, id)
	switch {
	case err == nil:
		if uerr := s.uninstall(ctx, in); uerr != nil {
			if !req.Msg.GetForce() {
				return nil, uninstallErr(id, in, uerr)
			}
			s.log.Warn("runner uninstall failed; deleting it anyway (force)", "org", org, "runner", id, "cluster", in.ClusterID, "err", uerr)
		} else {
			s.log.Info("runner uninstalled", "org", org, "runner", id, "cluster", in.ClusterID, "namespace", in.Namespace)
		}
	case !errors.Is(err, store.ErrNotFound):
		return nil, runnerErr(id, "", err)
	}
	if err := s.st.Runners().Delete(ctx, org, id, etag); err != nil {
		return nil, runnerErr(id, "", err)
	}
	s.log.Info("runner deleted", "org", org, "runner", id, "force", req.Msg.GetForce())
	return connect.NewResponse(&emptypb.Empty{}), nil
}

func (s *Service) ApplyAvailableUpdate(ctx context.Context, req *connect.Request[controlplanev1.ApplyAvailableUpdateRequest]) (*connect.Response[controlplanev1.ManagedRunner], error) {
	var vs violations
	checkRunnerID(&vs, "runner_id", req.Msg.GetRunnerId())
	if err := vs.err("invalid runner_id"); err != nil {
		return nil, err
	}
	org, id := principal(ctx).Org, req.Msg.GetRunnerId()
	cur, err := s.st.Runners().Get(ctx, org, id)
	if err != nil {
		return nil, runnerErr(id, "", err)
	}
	etag := req.Msg.GetEtag()
	if etag != "" && etag != cur.Etag {
		return nil, runnerErr(id, "", store.ErrConflict)
	}
	targets, err := s.channelTargets(ctx)
	if err != nil {
		return nil, err
	}
	target, ok := updateAvailable(cur, targets)
	if !ok {
		return nil, apierr.New(apierr.NoUpdateAvailable,
			fmt.Sprintf("no update is available for runner %s on channel %s (running %q, channel offers %q)",
				id, cur.ReleaseChannel, cur.Status.Version, targets[cur.ReleaseChannel]),
			map[string]string{"runner_id": id})
	}
	if etag == "" {
		etag = cur.Etag
	}
	// Now, whatever the maintenance window says; the health gate (internal/rollout) ends the
	// step: it clears desired_version once the runner reports it and ready, or rolls the
	// runner back when the deadline passes.
	att := rollout.Attempt(cur.Status.Version, target, s.now(), s.deadline)
	undo, err := s.UpdateStarting(ctx, cur)
	if err != nil {
		return nil, runnerErr(id, "", err)
	}
	out, err := s.st.Runners().Update(ctx, org, id, etag, store.RunnerUpdate{DesiredVersion: &target, LastUpdate: &att})
	if err != nil {
		undo()
		return nil, runnerErr(id, "", err)
	}
	s.log.Info("runner update applied", "org", org, "runner", id, "from", cur.Status.Version, "to", target, "deadline", att.Deadline)
	if err := s.UpdateStarted(ctx, out); err != nil {
		return nil, runnerErr(id, "", err)
	}
	return s.withHalts(ctx, targets, org, s.withInstall(ctx, s.toProto(ctx, out, targets), org))
}

// rolloutStatus fills st's install and rollout fields from its version, desired_version and
// target_version. install_status is SELF_MANAGED here; withInstall sets it for a runner the
// control plane installs (INSTALLING/INSTALLED/FAILED). active_revision is the version the heartbeats report; target_revision is the
// applied update's version, else the channel's; a rollout is in progress while an applied
// version is not yet reported, whether the runner is connected or not, and while an update
// step waits for its health gate.
func rolloutStatus(st *controlplanev1.ManagedRunnerStatus) {
	st.InstallStatus = controlplanev1.RunnerInstallStatus_RUNNER_INSTALL_STATUS_SELF_MANAGED
	st.ActiveRevision = st.GetVersion()
	st.TargetRevision = st.GetTargetVersion()
	if d := st.GetDesiredVersion(); d != "" {
		st.TargetRevision = d
		st.RolloutInProgress = st.GetVersion() != d
	}
	if st.GetLastUpdateResult().GetState() == controlplanev1.UpdateState_UPDATE_STATE_IN_PROGRESS {
		st.RolloutInProgress = true
	}
}

// updateAvailable returns the runner's channel's target version (targets, from
// channelTargets) when the runner runs another one.
func updateAvailable(r store.Runner, targets map[string]string) (string, bool) {
	target := targets[r.ReleaseChannel]
	return target, target != "" && r.Status.Version != "" && r.Status.Version != target
}

// runnerErr maps a store error to the API's.
func runnerErr(runnerID, clusterID string, err error) error {
	var ae *store.AlreadyExistsError
	switch {
	case errors.As(err, &ae) && ae.Key == store.KeyClusterID:
		return apierr.New(apierr.AlreadyExists,
			fmt.Sprintf("cluster %s already has a runner: one runner per cluster", clusterID),
			map[string]string{"field": "cluster_id", "cluster_id": clusterID})
	case errors.As(err, &ae):
		return apierr.New(apierr.AlreadyExists,
			fmt.Sprintf("a runner with runner_id %s already exists (runner IDs are unique across organizations: they name the runner's endpoint hosts and certificates); choose another runner_id", runnerID),
			map[string]string{"field": "runner_id", "runner_id": runnerID})
	case errors.Is(err, store.ErrNotFound):
		return apierr.New(apierr.RunnerNotFound, fmt.Sprintf("runner %s not found", runnerID),
			map[string]string{"runner_id": runnerID})
	case errors.Is(err, store.ErrConflict):
		return apierr.New(apierr.EtagMismatch,
			fmt.Sprintf("runner %s changed since it was read (etag mismatch): get it again and retry", runnerID),
			map[string]string{"runner_id": runnerID})
	case errors.Is(err, store.ErrInvalid):
		return apierr.Newf(apierr.InvalidRequest, "%v", err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return apierr.Newf(apierr.ControlPlaneUnavailable, "control plane store: %v", err)
}

// Resources is the JSON form of a runner's capacity and usage in the store.
type Resources struct {
	MilliCPU    int64 `json:"milli_cpu"`
	MemoryBytes int64 `json:"memory_bytes"`
	Sandboxes   int64 `json:"sandboxes,omitempty"`
}

func resourcesProto(b json.RawMessage) *controlplanev1.RunnerResources {
	if b == nil {
		return nil
	}
	var r Resources
	if json.Unmarshal(b, &r) != nil {
		return nil
	}
	return &controlplanev1.RunnerResources{MilliCpu: r.MilliCPU, MemoryBytes: r.MemoryBytes, Sandboxes: r.Sandboxes}
}

// toProto is the runner as the API shows it; targets are channelTargets.
func (s *Service) toProto(ctx context.Context, r store.Runner, targets map[string]string) *controlplanev1.ManagedRunner {
	out := &controlplanev1.ManagedRunner{
		RunnerId:       r.RunnerID,
		ClusterId:      r.ClusterID,
		Zone:           r.Zone,
		RunnerGroupId:  r.RunnerGroupID,
		DisplayName:    r.DisplayName,
		ReleaseChannel: controlplanev1.ReleaseChannel_STABLE,
		Etag:           r.Etag,
		CreateTime:     timestamppb.New(r.CreatedAt),
		UpdateTime:     timestamppb.New(r.UpdatedAt),
		PolicyRevision: r.PolicyRevision,

		MaintenancePolicy: maintenanceProto(r.MaintenancePolicy),
	}
	if r.ReleaseChannel == store.ChannelRapid {
		out.ReleaseChannel = controlplanev1.ReleaseChannel_RAPID
	}
	if r.Policy != nil {
		var p structpb.Struct
		if err := protojson.Unmarshal(r.Policy, &p); err == nil {
			out.Policy = &p
		}
	}
	st := &controlplanev1.ManagedRunnerStatus{
		Connection:     controlplanev1.ConnectionStatus_DISCONNECTED,
		Ready:          r.Status.Ready,
		Version:        r.Status.Version,
		TargetVersion:  targets[r.ReleaseChannel],
		DesiredVersion: r.DesiredVersion,
		Capacity:       resourcesProto(r.Status.Capacity),
		Usage:          resourcesProto(r.Status.Usage),

		LastUpdateResult: updateResultProto(r.LastUpdate),
		SelfUpdate:       r.Status.SelfUpdate,

		SelfUpdateFailedVersion: r.Status.SelfUpdateFailedVersion,
		SelfUpdateFailure:       r.Status.SelfUpdateFailure,

		Prepull: s.prepullProto(ctx, r.Org, r.Status.Prepull),
	}
	_, st.UpdateAvailable = updateAvailable(r, targets)
	rolloutStatus(st)
	if hb := r.Status.LastHeartbeatAt; hb != nil {
		st.LastHeartbeatTime = timestamppb.New(*hb)
		if s.now().Sub(*hb) <= 3*s.interval {
			st.Connection = controlplanev1.ConnectionStatus_CONNECTED
		}
	}
	if st.Connection != controlplanev1.ConnectionStatus_CONNECTED {
		st.Ready = false
	}
	out.Status = st
	return out
}
