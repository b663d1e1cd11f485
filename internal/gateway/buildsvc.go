package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// BuildService (sandboxd.build.v1, docs/builds.md "API"): StartBuild checks and records a
// build QUEUED and answers at once; a queue in this gateway places it on a runner whose
// capacity has a builder image, with a free build slot and room for the builder, mints
// the registry tokens and runs it there (the runner's Build stream), writing its events
// to the store as they come (bounded per build) and its record on every state change. On
// success a template target's template gets the image by digest.

// Defaults of BuildOptions.
const (
	DefaultBuildsPerRunner  = 1
	DefaultMaxBuildsQueued  = 8 // queued or running, this gateway (their contexts are in memory)
	DefaultMaxOrgBuilds     = 4 // queued or running, one organization
	DefaultBuildQueueWait   = 10 * time.Minute
	DefaultMaxBuildLogLines = 20000
	DefaultMaxBuildLogBytes = 8 << 20
	// buildLogTail is how many of the last lines of a log over its bounds are kept (the
	// lines between the bounds and the tail are dropped, and one line says how many).
	buildLogTail = 200
	// buildFlushInterval is how often a running build's events are written to the store
	// (followers see them then).
	buildFlushInterval   = 200 * time.Millisecond
	defaultBuildPageSize = 50
	maxBuildPageSize     = 500
	defaultBuilderSize   = "medium"
)

// Failure reasons of a build that are not CWSANDBOX_* reasons (Build.failure_reason).
const (
	BuildReasonStepFailed       = "BuildStepFailed"
	BuildReasonTimedOut         = "BuildTimedOut"
	BuildReasonFailed           = "BuildFailed"
	BuildReasonGatewayRestarted = "GatewayRestarted"
	BuildReasonGatewayStopped   = "GatewayStopped"
	BuildReasonTemplateFailed   = "TemplateUpdateFailed"
)

// builderSizes are the builder sandbox's resources by StartBuildRequest.builder_size
// (fixed here; not yet the runner policy's).
var builderSizes = map[string]runtime.Resources{
	"small":  {MilliCPU: 1000, RequestMilliCPU: 1000, MemoryBytes: 1 << 30, RequestMemoryBytes: 1 << 30, Pids: 1024},
	"medium": {MilliCPU: 2000, RequestMilliCPU: 2000, MemoryBytes: 2 << 30, RequestMemoryBytes: 2 << 30, Pids: 1024},
	"large":  {MilliCPU: 4000, RequestMilliCPU: 4000, MemoryBytes: 8 << 30, RequestMemoryBytes: 8 << 30, Pids: 4096},
}

// BuildOptions configures image builds (Config.Builds).
type BuildOptions struct {
	// Store keeps the builds and their logs; nil: BuildService answers
	// CWSANDBOX_NOT_IMPLEMENTED.
	Store store.Builds
	// RegistryHost is the platform registry's host[:port] (registry.Config.Host);
	// MintPushToken and MintPullToken mint its tokens for an organization
	// (registry.Registry's). Without them StartBuild answers CWSANDBOX_BUILD_NOT_SUPPORTED.
	RegistryHost                 string
	MintPushToken, MintPullToken func(org string, ttl time.Duration) (string, error)
	// PushInsecure: the registry may speak plain HTTP (passed to the runner's push,
	// in-process or over the runner wire).
	PushInsecure bool
	// PerRunner is how many builds run at once on one runner (default
	// DefaultBuildsPerRunner); MaxQueued and MaxPerOrg bound the builds queued or running
	// in this gateway, in all and per organization (StartBuild answers
	// CWSANDBOX_SERVER_BUSY beyond); QueueWait is how long a build waits for a runner with
	// room before it fails.
	PerRunner, MaxQueued, MaxPerOrg int
	QueueWait                       time.Duration
	// MaxContextBytes bounds StartBuildRequest.context (default
	// DefaultMaxBuildContextBytes); MaxLogLines and MaxLogBytes a build's log lines.
	MaxContextBytes          int
	MaxLogLines, MaxLogBytes int
	// Settings keeps the organizations' build storage settings
	// (SettingsService.Get/UpdateBuildStorageConfig, settings_builds.go); nil: every
	// organization has the defaults and updates are UNIMPLEMENTED.
	Settings store.BuildStorageConfigs
	// StorageEndpoints are the S3 endpoints an organization's own build storage (mode
	// CUSTOMER_OWNED) may be at (`--build-storage-endpoints`); none: CUSTOMER_OWNED is
	// refused. OnStorageChange, optional, is called with an organization whose build
	// storage config was updated (registry.Registry.ForgetOrgStorage).
	StorageEndpoints []BuildStorageEndpoint
	OnStorageChange  func(org string)
	// Retention: ended builds (SUCCEEDED, FAILED, CANCELLED) last updated longer ago than
	// this are deleted with their logs (0: kept forever). Keep: at most this many ended
	// builds per organization, the oldest beyond deleted (0: no bound). A sweep runs at
	// start and every SweepInterval (0: DefaultBuildSweepInterval; negative: none) when
	// either is set; Now is its clock (nil: time.Now).
	Retention     time.Duration
	Keep          int
	SweepInterval time.Duration
	Now           func() time.Time
}

func (o BuildOptions) withDefaults() BuildOptions {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.PerRunner, DefaultBuildsPerRunner)
	def(&o.MaxQueued, DefaultMaxBuildsQueued)
	def(&o.MaxPerOrg, DefaultMaxOrgBuilds)
	def(&o.MaxContextBytes, DefaultMaxBuildContextBytes)
	def(&o.MaxLogLines, DefaultMaxBuildLogLines)
	def(&o.MaxLogBytes, DefaultMaxBuildLogBytes)
	if o.QueueWait <= 0 {
		o.QueueWait = DefaultBuildQueueWait
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = DefaultBuildSweepInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// buildRunner is a runner handle that builds images (runner.Local, runnerapi.Client).
type buildRunner interface {
	Build(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error)
}

// buildService serves sandboxd.build.v1.BuildService.
type buildService struct {
	s   *Server
	st  store.Builds
	cfg BuildOptions
	ctx context.Context // the server's: its end stops every build

	mu      sync.Mutex
	live    map[string]*liveBuild // queued or running here
	waiting []*liveBuild          // queued, in order
	running []int                 // per runner index
	poke    chan struct{}
}

// liveBuild is a build queued or running in this gateway. rec, changed and the fields
// below them are guarded by buildService.mu.
type liveBuild struct {
	id, org, keyID string
	target         buildTarget
	req            *buildv1.StartBuildRequest // its context is dropped once sent
	resources      runtime.Resources
	queuedAt       time.Time

	rec       *buildv1.Build
	changed   chan struct{} // closed when events were stored (then replaced)
	cancel    context.CancelFunc
	cancelled string // who cancelled it
	finished  bool   // finish has begun (it runs once)
	done      chan struct{}
}

func newBuildService(s *Server, cfg BuildOptions, ctx context.Context) *buildService {
	bs := &buildService{s: s, st: cfg.Store, cfg: cfg.withDefaults(), ctx: ctx, live: map[string]*liveBuild{},
		running: make([]int, len(s.runners)), poke: make(chan struct{}, 1)}
	if bs.st != nil {
		bs.failUnfinished(ctx)
		s.loops.Go(func() { bs.dispatchLoop(ctx) })
		s.loops.Go(func() { bs.sweepLoop(ctx) })
	}
	return bs
}

func (bs *buildService) store() (store.Builds, error) {
	if bs == nil || bs.st == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "image builds need a store (this gateway has none)")
	}
	return bs.st, nil
}

func buildNotFound(id string) error {
	return apierr.New(apierr.BuildNotFound, fmt.Sprintf("build %q not found", imagebuild.Clip(id, 64)), map[string]string{"build_id": imagebuild.Clip(id, 64)})
}

func terminalBuild(s buildv1.BuildState) bool {
	return s == buildv1.BuildState_BUILD_STATE_SUCCEEDED || s == buildv1.BuildState_BUILD_STATE_FAILED || s == buildv1.BuildState_BUILD_STATE_CANCELLED
}

func decodeBuild(b store.Build) (*buildv1.Build, error) {
	rec := &buildv1.Build{}
	if err := proto.Unmarshal(b.Record, rec); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("build %s: decode record: %w", b.ID, err))
	}
	return rec, nil
}

// get is the caller's build id: this gateway's live record, else the stored one.
func (bs *buildService) get(ctx context.Context, id string) (*buildv1.Build, error) {
	st, err := bs.store()
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "build_id is required", []apierr.Violation{{Field: "build_id", Description: "is required"}})
	}
	org := principal(ctx).Org
	bs.mu.Lock()
	if lb, ok := bs.live[id]; ok && lb.org == org {
		rec := proto.CloneOf(lb.rec)
		bs.mu.Unlock()
		return rec, nil
	}
	bs.mu.Unlock()
	if len(id) > 128 {
		return nil, buildNotFound(id)
	}
	b, err := st.Get(ctx, org, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, buildNotFound(id)
	case err != nil:
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return decodeBuild(b)
}

func (bs *buildService) StartBuild(ctx context.Context, req *connect.Request[buildv1.StartBuildRequest]) (*connect.Response[buildv1.StartBuildResponse], error) {
	if _, err := bs.store(); err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "StartBuild"); err != nil {
		return nil, err
	}
	rec, err := bs.start(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&buildv1.StartBuildResponse{Build: rec}), nil
}

// canBuild is nil when this gateway can queue builds of org (a store, a platform
// registry, and org's build storage config does not disable builds).
func (bs *buildService) canBuild(ctx context.Context, org string) error {
	if _, err := bs.store(); err != nil {
		return err
	}
	if bs.cfg.RegistryHost == "" || bs.cfg.MintPushToken == nil || bs.cfg.MintPullToken == nil {
		return apierr.New(apierr.BuildNotSupported, "this gateway has no platform registry to push built images to (sandboxd --registry)", nil)
	}
	return bs.s.buildsEnabled(ctx, org)
}

// start checks m and queues it as a build of the caller's organization (StartBuild's,
// and the builds of a Compose file's services: fromfile.go); a request_id already used
// by an equal request answers that build as it is now.
func (bs *buildService) start(ctx context.Context, m *buildv1.StartBuildRequest) (*buildv1.Build, error) {
	p := principal(ctx)
	if err := bs.canBuild(ctx, p.Org); err != nil {
		return nil, err
	}
	st := bs.st
	target, err := checkStartBuild(p.Org, m, bs.cfg.MaxContextBytes)
	var vs []apierr.Violation
	if err != nil {
		vs = apierr.Violations(err)
	}
	if target.Template != "" {
		vs = append(vs, displayNameViolations("template", target.Template)...)
		if bs.s.templates == nil {
			return nil, apierr.Newf(apierr.NotImplemented, "a template target needs sandbox templates (this gateway has no template store)")
		}
	}
	size := m.GetBuilderSize()
	if size == "" {
		size = defaultBuilderSize
	}
	res, ok := builderSizes[size]
	if !ok {
		vs = append(vs, apierr.Violation{Field: "builder_size", Description: fmt.Sprintf("%q: want small, medium or large (default %s)", imagebuild.Clip(size, 64), defaultBuilderSize)})
	}
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid build: "+apierr.Describe(vs), vs)
	}
	// The request's identity: its fields, the context by its hash (not copied).
	ctxSum := sha256.Sum256(m.GetContext())
	d := digest("build", &buildv1.StartBuildRequest{Target: m.Target, Dockerfile: m.GetDockerfile(), Context: ctxSum[:], BuildArgs: m.GetBuildArgs(),
		TargetStage: m.GetTargetStage(), BuilderSize: m.GetBuilderSize(), TimeoutSeconds: m.GetTimeoutSeconds(), NoCache: m.GetNoCache()})
	replay := func() (*buildv1.Build, bool, error) {
		first, err := st.GetByRequestID(ctx, p.Org, m.GetRequestId())
		if err != nil {
			return nil, false, nil
		}
		if first.RequestDigest != d {
			vs := []apierr.Violation{{Field: "request_id", Description: "already started a build from a different request"}}
			return nil, true, apierr.Invalid(apierr.RequestIDConflict, "request_id conflict: "+apierr.Describe(vs), vs)
		}
		rec, err := bs.get(ctx, first.ID)
		if err != nil {
			return nil, true, err
		}
		return rec, true, nil
	}
	if m.GetRequestId() != "" {
		if out, ok, err := replay(); ok {
			return out, err
		}
	}

	now := time.Now()
	rec := &buildv1.Build{BuildId: uuid.NewString(), State: buildv1.BuildState_BUILD_STATE_QUEUED, Dockerfile: m.GetDockerfile(), BuilderSize: size,
		CreateTime: timestamppb.New(now)}
	if rec.Dockerfile == "" {
		rec.Dockerfile = "Dockerfile"
	}
	switch t := m.GetTarget().(type) {
	case *buildv1.StartBuildRequest_Template:
		rec.Target = &buildv1.Build_Template{Template: target.Template}
	case *buildv1.StartBuildRequest_Repository:
		rec.Target = &buildv1.Build_Repository{Repository: t.Repository}
	}
	lb := &liveBuild{id: rec.BuildId, org: p.Org, keyID: p.KeyID, target: target, req: m, resources: res, queuedAt: now,
		rec: rec, changed: make(chan struct{}), done: make(chan struct{})}

	bs.mu.Lock()
	n, orgN := len(bs.live), 0
	for _, o := range bs.live {
		if o.org == p.Org {
			orgN++
		}
	}
	if n >= bs.cfg.MaxQueued || orgN >= bs.cfg.MaxPerOrg {
		bs.mu.Unlock()
		return nil, apierr.WithRetry(apierr.Newf(apierr.ServerBusy, "this gateway has %d builds queued or running (%d of the organization; at most %d and %d): retry later",
			n, orgN, bs.cfg.MaxQueued, bs.cfg.MaxPerOrg), 30*time.Second)
	}
	bs.live[lb.id] = lb // held while it is stored, so the bounds count it
	bs.mu.Unlock()

	recBytes, _ := proto.Marshal(rec)
	_, err = st.Create(ctx, store.Build{ID: rec.BuildId, Org: p.Org, State: int32(rec.State), Template: target.Template, Record: recBytes,
		RequestID: m.GetRequestId(), RequestDigest: d})
	if err != nil {
		bs.mu.Lock()
		delete(bs.live, lb.id)
		bs.mu.Unlock()
		var dup *store.AlreadyExistsError
		if errors.As(err, &dup) && dup.Key == store.KeyRequestID {
			if out, ok, rerr := replay(); ok {
				return out, rerr
			}
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	ev, _ := proto.Marshal(&buildv1.BuildLogEvent{Seq: 1, Time: rec.CreateTime, Event: &buildv1.BuildLogEvent_Build{Build: rec}})
	if err := st.AppendEvents(ctx, rec.BuildId, 1, [][]byte{ev}); err != nil {
		bs.s.log.Warn("build: store its first event", "build", rec.BuildId, "err", err)
	}
	bs.mu.Lock()
	bs.waiting = append(bs.waiting, lb)
	out := proto.CloneOf(lb.rec)
	bs.mu.Unlock()
	bs.s.log.Info("build queued", "build", rec.BuildId, "org", p.Org, "repository", target.Repository, "template", target.Template, "context_bytes", len(m.GetContext()))
	bs.kick()
	return out, nil
}

func (bs *buildService) GetBuild(ctx context.Context, req *connect.Request[buildv1.GetBuildRequest]) (*connect.Response[buildv1.GetBuildResponse], error) {
	rec, err := bs.get(ctx, req.Msg.GetBuildId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&buildv1.GetBuildResponse{Build: rec}), nil
}

func (bs *buildService) ListBuilds(ctx context.Context, req *connect.Request[buildv1.ListBuildsRequest]) (*connect.Response[buildv1.ListBuildsResponse], error) {
	st, err := bs.store()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	size, err := apierr.PageSize(m.GetPageSize(), defaultBuildPageSize, maxBuildPageSize)
	if err != nil {
		return nil, err
	}
	org := principal(ctx).Org
	list, next, err := st.List(ctx, org, m.GetTemplate(), store.Page{Size: size, Token: m.GetPageToken()})
	switch {
	case errors.Is(err, store.ErrInvalid):
		return nil, badPageToken()
	case err != nil:
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	out := &buildv1.ListBuildsResponse{NextPageToken: next}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, b := range list {
		if lb, ok := bs.live[b.ID]; ok && lb.org == org {
			out.Builds = append(out.Builds, proto.CloneOf(lb.rec))
			continue
		}
		rec, err := decodeBuild(b)
		if err != nil {
			return nil, err
		}
		out.Builds = append(out.Builds, rec)
	}
	return connect.NewResponse(out), nil
}

// StreamBuildLogs sends the stored events after after_seq; with follow it waits for more
// (woken by this gateway's writes, else polling the store each second) until the final
// Build event.
func (bs *buildService) StreamBuildLogs(ctx context.Context, req *connect.Request[buildv1.StreamBuildLogsRequest], stream *connect.ServerStream[buildv1.StreamBuildLogsResponse]) error {
	return bs.streamLogs(ctx, req.Msg, func(ev *buildv1.BuildLogEvent) error {
		return stream.Send(&buildv1.StreamBuildLogsResponse{Event: ev})
	})
}

// streamLogs is StreamBuildLogs with send for the stream.
func (bs *buildService) streamLogs(ctx context.Context, m *buildv1.StreamBuildLogsRequest, send func(*buildv1.BuildLogEvent) error) error {
	if _, err := bs.get(ctx, m.GetBuildId()); err != nil {
		return err
	}
	if m.GetAfterSeq() < 0 {
		return apierr.Invalid(apierr.InvalidRequest, "after_seq must not be negative", []apierr.Violation{{Field: "after_seq", Description: "must not be negative"}})
	}
	org, id, after := principal(ctx).Org, m.GetBuildId(), m.GetAfterSeq()
	const page = 1000
	for {
		var changed chan struct{}
		bs.mu.Lock()
		if lb, ok := bs.live[id]; ok {
			changed = lb.changed
		}
		bs.mu.Unlock()
		evs, err := bs.st.Events(ctx, id, after, page)
		if err != nil {
			return connect.NewError(connect.CodeUnavailable, err)
		}
		for _, e := range evs {
			ev := &buildv1.BuildLogEvent{}
			if err := proto.Unmarshal(e.Event, ev); err != nil {
				return connect.NewError(connect.CodeInternal, fmt.Errorf("build %s event %d: %w", id, e.Seq, err))
			}
			ev.Seq = e.Seq
			if err := send(ev); err != nil {
				return err
			}
			after = e.Seq
			if b := ev.GetBuild(); b != nil && terminalBuild(b.GetState()) {
				return nil
			}
		}
		if len(evs) == page {
			continue
		}
		if !m.GetFollow() {
			return nil
		}
		if changed == nil {
			// Not running here: ended (its final event is stored, or was lost) or another
			// gateway's.
			if b, err := bs.st.Get(ctx, org, id); err == nil && terminalBuild(buildv1.BuildState(b.State)) {
				if more, err := bs.st.Events(ctx, id, after, 1); err == nil && len(more) == 0 {
					return nil
				}
				continue
			}
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed: // nil blocks: the timer polls
		case <-t.C:
		}
		t.Stop()
	}
}

func (bs *buildService) CancelBuild(ctx context.Context, req *connect.Request[buildv1.CancelBuildRequest]) (*connect.Response[buildv1.CancelBuildResponse], error) {
	if _, err := bs.store(); err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "CancelBuild"); err != nil {
		return nil, err
	}
	id := req.Msg.GetBuildId()
	rec, err := bs.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if terminalBuild(rec.GetState()) {
		return connect.NewResponse(&buildv1.CancelBuildResponse{Build: rec}), nil
	}
	p := principal(ctx)
	by := "cancelled by API key " + p.KeyID
	bs.mu.Lock()
	lb, ok := bs.live[id]
	if !ok || lb.org != p.Org {
		bs.mu.Unlock()
		// Recorded unfinished but not running here: this single gateway lost it (see
		// failUnfinished); it ends now.
		out, err := bs.finishOrphan(ctx, p.Org, id, buildv1.BuildState_BUILD_STATE_CANCELLED, "", by)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&buildv1.CancelBuildResponse{Build: out}), nil
	}
	if lb.cancelled == "" {
		lb.cancelled = by
	}
	queued := false
	if lb.cancel == nil {
		// Still queued, unless the dispatcher is failing it right now (then it ends as
		// that says).
		queued = bs.unqueueLocked(lb)
	} else {
		lb.cancel() // the runner's stream ends; the runner destroys the builder
	}
	bs.mu.Unlock()
	if queued {
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_CANCELLED, nil, "", by, nil)
	}
	// The build ends once the runner's stream does; answer its final state when that is
	// quick, else as it is.
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-lb.done:
	case <-t.C:
	case <-ctx.Done():
	}
	out, err := bs.get(ctx, id)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&buildv1.CancelBuildResponse{Build: out}), nil
}

// unqueueLocked removes lb from the queue and reports whether it was there.
func (bs *buildService) unqueueLocked(lb *liveBuild) bool {
	for i, w := range bs.waiting {
		if w == lb {
			bs.waiting = append(bs.waiting[:i], bs.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// kick asks the dispatcher to look at the queue now.
func (bs *buildService) kick() {
	select {
	case bs.poke <- struct{}{}:
	default:
	}
}

func (bs *buildService) dispatchLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			bs.stopAll()
			return
		case <-bs.poke:
		case <-t.C:
		}
		bs.dispatch()
	}
}

// stopAll ends the builds still queued when the gateway stops (running ones end as their
// contexts, children of the server's, do).
func (bs *buildService) stopAll() {
	bs.mu.Lock()
	queued := bs.waiting
	bs.waiting = nil
	bs.mu.Unlock()
	for _, lb := range queued {
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, nil, BuildReasonGatewayStopped, "the gateway stopped before the build started: start it again", nil)
	}
}

// dispatch starts every queued build a runner can take now, fails those no runner can
// ever build or that waited too long.
func (bs *buildService) dispatch() {
	bs.mu.Lock()
	idle := len(bs.waiting) == 0
	bs.mu.Unlock()
	if idle {
		return
	}
	views, loaded := bs.s.views.builders()
	if !loaded {
		return
	}
	// Each buildable runner's policy, read now like a create's placement reads it: a
	// builder whose size breaks the policy's resource limits is not placed there.
	pols := make([]*policy.Policy, len(views))
	polErrs := make([]error, len(views))
	pctx, cancel := context.WithTimeout(bs.ctx, 10*time.Second)
	for i, v := range views {
		if v.buildable {
			pols[i], _, polErrs[i] = bs.s.views.policyOf(pctx, i, v.id)
		}
	}
	cancel()
	type failure struct {
		lb          *liveBuild
		reason, msg string
	}
	var fails []failure
	bs.mu.Lock()
	// Builders started in this pass; earlier ones are counted by the views (confirmed)
	// until a probe reports them.
	held := make([]placement.Resources, len(views))
	var keep []*liveBuild
	for _, lb := range bs.waiting {
		need := placement.Resources{MilliCPU: lb.resources.RequestMilliCPU, MemoryBytes: lb.resources.RequestMemoryBytes}
		chosen := -1
		var why []string
		possible := false
		served := 0
		for i, v := range views {
			if !v.ownerKnown {
				possible = true // not heard from yet (unnamed: whose it is is not known)
				continue
			}
			if !v.serves(lb.org) {
				continue // another organization's runner: not a builder for it, not named
			}
			served++
			var misfit []policy.Violation
			if v.buildable && polErrs[i] == nil {
				misfit = pols[i].ResourcesMisfit("builder_size", lb.resources.MilliCPU, lb.resources.MemoryBytes)
			}
			switch {
			case !v.buildable:
				why = append(why, fmt.Sprintf("runner %s: %s", v.id, v.unavailable))
				if v.mayBuild {
					possible = true
				}
				continue
			case polErrs[i] != nil:
				why = append(why, fmt.Sprintf("runner %s: %v", v.id, polErrs[i]))
				possible = true // the store may answer again
				continue
			case len(misfit) > 0:
				why = append(why, fmt.Sprintf("runner %s: its policy does not allow the builder %s: %s", v.id, builderSizeOf(lb), policyMisfits(misfit)))
				continue
			case len(v.room.Never(need)) > 0:
				why = append(why, fmt.Sprintf("runner %s: has less than the builder's %s (%d milli-CPU, %d MiB)", v.id, builderSizeOf(lb), need.MilliCPU, need.MemoryBytes>>20))
				continue
			}
			possible = true
			switch misfit := v.room.Misfit(need, held[i], 0); {
			case bs.running[i] >= bs.cfg.PerRunner:
				why = append(why, fmt.Sprintf("runner %s: runs %d builds, its maximum", v.id, bs.running[i]))
			case misfit != "":
				why = append(why, fmt.Sprintf("runner %s: %s", v.id, misfit))
			case chosen < 0:
				chosen = i
			}
		}
		if served == 0 && !possible {
			why = append(why, "no runner here serves this organization ("+placement.ConstraintRunnerOwner+")")
		}
		switch {
		case chosen >= 0:
			bs.running[chosen]++
			held[chosen].MilliCPU += need.MilliCPU
			held[chosen].MemoryBytes += need.MemoryBytes
			bs.startLocked(lb, chosen, views[chosen].id, need)
		case !possible:
			fails = append(fails, failure{lb, apierr.BuildNotSupported, "no runner can build images: " + strings.Join(why, "; ")})
		case time.Since(lb.queuedAt) > bs.cfg.QueueWait:
			fails = append(fails, failure{lb, apierr.RunnerCapacityExhausted, fmt.Sprintf("no runner had room for the build within %s: %s", bs.cfg.QueueWait, strings.Join(why, "; "))})
		default:
			keep = append(keep, lb)
		}
	}
	bs.waiting = keep
	bs.mu.Unlock()
	for _, f := range fails {
		bs.finish(f.lb, buildv1.BuildState_BUILD_STATE_FAILED, nil, f.reason, f.msg, nil)
	}
}

func builderSizeOf(lb *liveBuild) string { return lb.rec.GetBuilderSize() }

// policyMisfits is vs as one sentence, each naming its constraint and limit.
func policyMisfits(vs []policy.Violation) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.ToAPI().Description
	}
	return strings.Join(out, "; ")
}

// startLocked marks lb RUNNING on runner i and runs it; bs.mu is held.
func (bs *buildService) startLocked(lb *liveBuild, i int, runnerID string, need placement.Resources) {
	ctx, cancel := context.WithCancel(bs.ctx)
	lb.cancel = cancel
	lb.rec.State = buildv1.BuildState_BUILD_STATE_RUNNING
	lb.rec.RunnerId = runnerID
	lb.rec.StartTime = timestamppb.Now()
	bs.s.views.confirmed(i, need)
	go bs.run(ctx, lb, i)
}

// run runs lb on runner i and records how it ended.
func (bs *buildService) run(ctx context.Context, lb *liveBuild, i int) {
	defer func() {
		bs.mu.Lock()
		bs.running[i]--
		bs.mu.Unlock()
		bs.s.views.poke()
		bs.kick()
	}()
	log := newBuildLog(bs, lb)
	bs.mu.Lock()
	rec := proto.CloneOf(lb.rec)
	bs.mu.Unlock()
	bs.storeRecord(lb.org, rec)
	log.build(rec)
	r := bs.s.runners[i]
	br, ok := r.(buildRunner)
	if !ok {
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, nil, apierr.BuildNotSupported, "runner "+r.ID()+" builds no images through this gateway", log)
		return
	}
	m := lb.req
	timeout := time.Duration(m.GetTimeoutSeconds()) * time.Second
	if timeout == 0 {
		timeout = runner.DefaultBuildTimeout
	}
	ttl := min(timeout+10*time.Minute, 24*time.Hour)
	push, err := bs.cfg.MintPushToken(lb.org, ttl)
	var pull string
	if err == nil {
		pull, err = bs.cfg.MintPullToken(lb.org, ttl)
	}
	if err != nil {
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, nil, BuildReasonFailed, "mint registry tokens: "+err.Error(), log)
		return
	}
	tag := bs.cfg.RegistryHost + "/" + lb.target.Repository + ":" + lb.target.Tag
	log.system(fmt.Sprintf("building on runner %s (builder %s), pushing to %s", r.ID(), lb.rec.GetBuilderSize(), tag))
	stop := log.flushEvery(buildFlushInterval)
	rctx, cancel := context.WithTimeout(ctx, timeout+2*time.Minute)
	defer cancel()
	res, err := br.Build(rctx, runner.BuildRequest{
		Options:       imagebuild.Options{Dockerfile: m.GetDockerfile(), BuildArgs: m.GetBuildArgs(), Target: m.GetTargetStage(), NoCache: m.GetNoCache()},
		Context:       bytes.NewReader(m.GetContext()),
		ContextLimits: runtime.ArchiveLimits{MaxBytes: MaxBuildContextUnpackedBytes, MaxFiles: MaxBuildContextFiles},
		// The pull token is for the platform registry's bases only (runner.BuildRequest).
		BaseCredentials:         &runtime.Credentials{Username: "sandboxd", Password: pull},
		BaseCredentialsRegistry: bs.cfg.RegistryHost,
		Push:                    tag, PushUsername: "sandboxd", PushPassword: push, PushInsecure: bs.cfg.PushInsecure,
		Resources:      lb.resources,
		Timeout:        timeout,
		OrganizationID: lb.org, // its layer cache is the organization's
	}, log.event)
	stop()
	bs.mu.Lock()
	lb.req = nil // the context is no longer needed
	cancelled := lb.cancelled
	bs.mu.Unlock()
	switch {
	case cancelled != "" && (err != nil || ctx.Err() != nil):
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_CANCELLED, res, "", cancelled, log)
	case err != nil && bs.ctx.Err() != nil:
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, res, BuildReasonGatewayStopped, "the gateway stopped during the build: start it again", log)
	case err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded):
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, res, BuildReasonTimedOut, fmt.Sprintf("the build did not end within its timeout (%s): %v", timeout, err), log)
	case err != nil:
		reason := apierr.Reason(err)
		if reason == "" {
			reason = BuildReasonFailed
		}
		if errors.Is(err, context.DeadlineExceeded) {
			reason = BuildReasonTimedOut
		}
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, res, reason, err.Error(), log)
	case res == nil || res.Result == nil:
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, res, BuildReasonFailed, "the runner returned no result", log)
	case res.ExitCode != 0:
		msg := fmt.Sprintf("the build exited with status %d", res.ExitCode)
		if f := res.Failed; f != nil {
			msg = fmt.Sprintf("step %d/%d %s failed: %s", f.Number, f.Total, f.Instruction, res.Why)
		} else if res.Why != "" {
			msg += ": " + res.Why
		}
		bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, res, BuildReasonStepFailed, msg, log)
	default:
		bs.succeed(ctx, lb, res, log)
	}
}

// succeed records a pushed image and, for a template target, makes it the template's.
func (bs *buildService) succeed(ctx context.Context, lb *liveBuild, res *runner.BuildResult, log *buildLog) {
	image := bs.cfg.RegistryHost + "/" + lb.target.Repository + "@" + res.Digest
	log.system("pushed " + image)
	bs.mu.Lock()
	lb.rec.Image, lb.rec.ImageDigest = image, res.Digest
	bs.mu.Unlock()
	if lb.target.Template != "" {
		t, err := bs.applyTemplate(context.WithoutCancel(ctx), lb, image)
		if err != nil {
			bs.finish(lb, buildv1.BuildState_BUILD_STATE_FAILED, res, BuildReasonTemplateFailed,
				fmt.Sprintf("the image %s was pushed, but template %q was not updated: %v", image, lb.target.Template, err), log)
			return
		}
		log.system(fmt.Sprintf("template %q (%s) is at revision %d with this image", t.DisplayName, t.ID, t.Revision))
		bs.mu.Lock()
		lb.rec.TemplateId, lb.rec.TemplateRevision = t.ID, t.Revision
		bs.mu.Unlock()
	}
	bs.finish(lb, buildv1.BuildState_BUILD_STATE_SUCCEEDED, res, "", "", log)
}

// applyTemplate makes image the primary container's image of lb's template (a template
// update: revision + 1), creating the template with only that image when there is none.
func (bs *buildService) applyTemplate(ctx context.Context, lb *liveBuild, image string) (store.Template, error) {
	st := bs.s.templates
	name := lb.target.Template
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			return store.Template{}, errors.New("the template kept changing: 5 attempts")
		}
		cur, err := st.GetByName(ctx, lb.org, name)
		if errors.Is(err, store.ErrNotFound) {
			sp, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Image: image}}})
			t, err := st.Create(ctx, store.Template{ID: uuid.NewString(), Org: lb.org, DisplayName: name, Spec: sp, CreateUserID: lb.keyID}, MaxTemplatesPerOrg)
			var dup *store.AlreadyExistsError
			if errors.As(err, &dup) {
				continue // created meanwhile: update it
			}
			if err == nil {
				bs.s.pokeWarm()
			}
			return t, err
		}
		if err != nil {
			return store.Template{}, err
		}
		p := &sandboxv1.PartialSandboxSpec{}
		if err := proto.Unmarshal(cur.Spec, p); err != nil {
			return store.Template{}, fmt.Errorf("decode the template's spec: %w", err)
		}
		setPrimaryImage(p, image)
		sp, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
		if err != nil {
			return store.Template{}, err
		}
		t, err := st.Update(ctx, lb.org, cur.ID, cur.Revision, store.TemplateUpdate{Spec: sp})
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			continue // updated or deleted meanwhile: read it again
		}
		if err == nil {
			bs.s.pokeWarm()
		}
		return t, err
	}
}

// setPrimaryImage sets the image of p's primary container (the first marked primary,
// else the first), adding one when p has none.
func setPrimaryImage(p *sandboxv1.PartialSandboxSpec, image string) {
	cs := p.GetContainers()
	if len(cs) == 0 {
		p.Containers = []*sandboxv1.PartialContainer{{Image: image}}
		return
	}
	for _, c := range cs {
		if c.GetPrimary() {
			c.Image = image
			return
		}
	}
	cs[0].Image = image
}

// finish records lb's end (state, the runner's result, why) as its record and its final
// event, and forgets it.
func (bs *buildService) finish(lb *liveBuild, state buildv1.BuildState, res *runner.BuildResult, reason, msg string, log *buildLog) {
	if log == nil {
		log = newBuildLog(bs, lb)
	}
	bs.mu.Lock()
	if lb.finished {
		bs.mu.Unlock()
		return
	}
	lb.finished = true
	rec := lb.rec
	rec.State = state
	rec.EndTime = timestamppb.Now()
	if res != nil && res.Result != nil {
		rec.Steps = nil
		for _, s := range res.Steps {
			rec.Steps = append(rec.Steps, stepProto(s))
			rec.TotalSteps = int32(s.Total)
		}
		if res.Failed != nil {
			rec.FailedStep = stepProto(*res.Failed)
		}
	}
	if state == buildv1.BuildState_BUILD_STATE_FAILED {
		rec.FailureReason, rec.FailureMessage = reason, imagebuild.Clip(msg, 4096)
	} else if state == buildv1.BuildState_BUILD_STATE_CANCELLED {
		rec.FailureMessage = imagebuild.Clip(msg, 4096)
	}
	final := proto.CloneOf(rec)
	bs.mu.Unlock()
	if msg != "" {
		log.system(msg)
	}
	log.close(final)
	bs.storeRecord(lb.org, final)
	bs.mu.Lock()
	delete(bs.live, lb.id)
	close(lb.changed)
	bs.mu.Unlock()
	close(lb.done)
	bs.s.log.Info("build ended", "build", lb.id, "org", lb.org, "state", state, "reason", reason, "image", final.GetImage())
}

func stepProto(s imagebuild.Step) *buildv1.BuildStep {
	return &buildv1.BuildStep{Number: int32(s.Number), Instruction: s.Instruction, Cached: s.Cached}
}

func (bs *buildService) storeRecord(org string, rec *buildv1.Build) {
	b, _ := proto.Marshal(rec)
	if _, err := bs.st.Update(context.Background(), org, rec.GetBuildId(), int32(rec.GetState()), b); err != nil {
		bs.s.log.Warn("build: store its record", "build", rec.GetBuildId(), "state", rec.GetState(), "err", err)
	}
}

// failUnfinished ends the builds the store has QUEUED or RUNNING at start-up: this
// gateway ran them (one gateway per store), so they died with its previous process.
// Several gateways on one store would need an owner per build and a lease instead.
func (bs *buildService) failUnfinished(ctx context.Context) {
	list, err := bs.st.InStates(ctx, []int32{int32(buildv1.BuildState_BUILD_STATE_QUEUED), int32(buildv1.BuildState_BUILD_STATE_RUNNING)}, 0)
	if err != nil {
		bs.s.log.Warn("build: find unfinished builds", "err", err)
		return
	}
	for _, b := range list {
		was := buildv1.BuildState(b.State)
		if _, err := bs.finishOrphan(ctx, b.Org, b.ID, buildv1.BuildState_BUILD_STATE_FAILED, BuildReasonGatewayRestarted,
			fmt.Sprintf("the gateway restarted while the build was %s: start it again", strings.TrimPrefix(was.String(), "BUILD_STATE_"))); err != nil {
			bs.s.log.Warn("build: fail an unfinished build", "build", b.ID, "err", err)
		} else {
			bs.s.log.Info("build left unfinished by a previous gateway failed", "build", b.ID, "org", b.Org, "was", was)
		}
	}
}

// finishOrphan ends a stored build no gateway runs: its record and a final event.
func (bs *buildService) finishOrphan(ctx context.Context, org, id string, state buildv1.BuildState, reason, msg string) (*buildv1.Build, error) {
	b, err := bs.st.Get(ctx, org, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, buildNotFound(id)
	} else if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	rec, err := decodeBuild(b)
	if err != nil {
		return nil, err
	}
	if terminalBuild(rec.GetState()) {
		return rec, nil
	}
	rec.State, rec.EndTime = state, timestamppb.Now()
	if state == buildv1.BuildState_BUILD_STATE_FAILED {
		rec.FailureReason = reason
	}
	rec.FailureMessage = msg
	last := int64(0)
	for {
		evs, err := bs.st.Events(ctx, id, last, 10000)
		if err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, err)
		}
		if len(evs) == 0 {
			break
		}
		last = evs[len(evs)-1].Seq
	}
	now := timestamppb.Now()
	line, _ := proto.Marshal(&buildv1.BuildLogEvent{Seq: last + 1, Time: now, Event: &buildv1.BuildLogEvent_Line{Line: &buildv1.LogLine{Stream: buildv1.LogLine_STREAM_SYSTEM, Text: msg}}})
	final, _ := proto.Marshal(&buildv1.BuildLogEvent{Seq: last + 2, Time: now, Event: &buildv1.BuildLogEvent_Build{Build: rec}})
	if err := bs.st.AppendEvents(ctx, id, last+1, [][]byte{line, final}); err != nil {
		bs.s.log.Warn("build: store its final event", "build", id, "err", err)
	}
	recBytes, _ := proto.Marshal(rec)
	if _, err := bs.st.Update(ctx, org, id, int32(state), recBytes); err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return rec, nil
}

// buildLog numbers a running build's events and writes them to the store in batches,
// waking followers after each; lines beyond the bounds are dropped but for the last
// buildLogTail, written at the end after a line saying how many were dropped.
type buildLog struct {
	bs *buildService
	lb *liveBuild

	mu           sync.Mutex
	next         int64
	pending      []*buildv1.BuildLogEvent
	lines, bytes int
	dropped      int
	tail         []*buildv1.LogLine // ring once full
	tailAt       int
	closed       bool
	flushMu      sync.Mutex
}

func newBuildLog(bs *buildService, lb *liveBuild) *buildLog {
	return &buildLog{bs: bs, lb: lb, next: 2} // 1: the QUEUED build (StartBuild)
}

// event takes one of the runner's events. (A step's "Using cache" line comes after its
// step event: the record learns the cache hits from the result at the end.)
func (l *buildLog) event(ev imagebuild.Event) {
	if ev.Step != nil {
		st := stepProto(*ev.Step)
		l.bs.mu.Lock()
		rec := l.lb.rec
		if len(rec.Steps) < 1000 {
			rec.Steps = append(rec.Steps, proto.CloneOf(st))
		}
		rec.TotalSteps = int32(ev.Step.Total)
		l.bs.mu.Unlock()
		l.add(&buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Step{Step: st}})
		return
	}
	if ev.Line == "" && ev.Stream == 0 {
		return
	}
	l.line(&buildv1.LogLine{Stream: buildv1.LogLine_Stream(ev.Stream), Step: int32(ev.InStep), Text: ev.Line})
}

func (l *buildLog) line(line *buildv1.LogLine) {
	l.mu.Lock()
	if l.lines < l.bs.cfg.MaxLogLines && l.bytes+len(line.Text) <= l.bs.cfg.MaxLogBytes {
		l.lines++
		l.bytes += len(line.Text)
		l.mu.Unlock()
		l.add(&buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Line{Line: line}})
		return
	}
	l.dropped++
	if len(l.tail) < buildLogTail {
		l.tail = append(l.tail, line)
	} else {
		l.tail[l.tailAt] = line
		l.tailAt = (l.tailAt + 1) % buildLogTail
	}
	l.mu.Unlock()
}

func (l *buildLog) system(text string) {
	l.add(&buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Line{Line: &buildv1.LogLine{Stream: buildv1.LogLine_STREAM_SYSTEM, Text: imagebuild.Clip(text, imagebuild.MaxLine)}}})
}

func (l *buildLog) build(rec *buildv1.Build) {
	l.add(&buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Build{Build: proto.CloneOf(rec)}})
}

func (l *buildLog) add(ev *buildv1.BuildLogEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	ev.Seq, ev.Time = l.next, timestamppb.Now()
	l.next++
	l.pending = append(l.pending, ev)
}

// flush writes the pending events and wakes the followers.
func (l *buildLog) flush() {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.mu.Lock()
	evs := l.pending
	l.pending = nil
	l.mu.Unlock()
	if len(evs) == 0 {
		return
	}
	enc := make([][]byte, len(evs))
	for i, ev := range evs {
		enc[i], _ = proto.Marshal(ev)
	}
	if err := l.bs.st.AppendEvents(context.Background(), l.lb.id, evs[0].Seq, enc); err != nil {
		l.bs.s.log.Warn("build: store events", "build", l.lb.id, "from", evs[0].Seq, "n", len(evs), "err", err)
	}
	l.bs.mu.Lock()
	close(l.lb.changed)
	l.lb.changed = make(chan struct{})
	l.bs.mu.Unlock()
}

// flushEvery flushes every d until the returned stop is called (which flushes once more).
func (l *buildLog) flushEvery(d time.Duration) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				l.flush()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		l.flush()
	}
}

// close writes what was dropped, the tail and the final build, and flushes; later
// events are ignored.
func (l *buildLog) close(final *buildv1.Build) {
	l.mu.Lock()
	dropped, tail, at := l.dropped, l.tail, l.tailAt
	l.mu.Unlock()
	if dropped > 0 {
		kept := min(dropped, buildLogTail)
		l.system(fmt.Sprintf("log truncated: %d lines dropped (a build keeps at most %d lines and %d bytes, and its last %d lines)",
			dropped-kept, l.bs.cfg.MaxLogLines, l.bs.cfg.MaxLogBytes, buildLogTail))
		for i := range tail {
			l.add(&buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Line{Line: tail[(at+i)%len(tail)]}})
		}
	}
	l.build(final)
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.flush()
}

// buildLogsREST serves GET /v1/builds/{build_id}/logs (query after_seq, follow), which
// the REST transcoder cannot (a server stream whose messages are not google.api.HttpBody):
// the events as newline-delimited JSON (application/x-ndjson), one StreamBuildLogsResponse
// a line, flushed as they come. An error before the first event is the usual AIP-193
// answer; one after it is a last line {"error": google.rpc.Status}.
func (s *Server) buildLogsREST(w http.ResponseWriter, r *http.Request) {
	ctx, err := auth.Interceptor{Auth: s.auth}.Authorize(r.Context(), r.Header)
	if err != nil {
		apifront.WriteRESTError(w, err)
		return
	}
	m := &buildv1.StreamBuildLogsRequest{BuildId: r.PathValue("build_id")}
	q := r.URL.Query()
	var vs []apierr.Violation
	for _, k := range []string{"after_seq", "afterSeq"} {
		if v := q.Get(k); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				vs = append(vs, apierr.Violation{Field: "after_seq", Description: "is not an integer"})
			}
			m.AfterSeq = n
		}
	}
	if v := q.Get("follow"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			vs = append(vs, apierr.Violation{Field: "follow", Description: "is not true or false"})
		}
		m.Follow = f
	}
	if len(vs) > 0 {
		apifront.WriteRESTError(w, apierr.Invalid(apierr.InvalidRequest, "invalid request: "+apierr.Describe(vs), vs))
		return
	}
	rc := http.NewResponseController(w)
	started := false
	err = s.builds.streamLogs(ctx, m, func(ev *buildv1.BuildLogEvent) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		b, err := protojson.Marshal(&buildv1.StreamBuildLogsResponse{Event: ev})
		if err != nil {
			return err
		}
		if _, err := w.Write(append(b, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	})
	switch {
	case err == nil:
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
	case !started:
		apifront.WriteRESTError(w, err)
	default:
		code := connect.CodeOf(err)
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": int(code), "message": err.Error()}})
		_, _ = w.Write(append(b, '\n'))
	}
}
