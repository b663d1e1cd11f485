package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"connectrpc.com/connect"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
)

// Image builds (sandboxd's own BuildService, beside the wire protocol, same
// credentials): an OCI image built from a Dockerfile and a context inside a builder
// sandbox, pushed to the platform registry and, for a template target, made the
// template's image. The context is an fsarchive archive (PackBuildContext makes one from
// a directory); BuildTemplate packs, starts and follows in one call.

// BuildState is a build's lifecycle state.
type BuildState int32

// Build states, numbered as in sandboxd.build.v1.BuildState.
const (
	BuildUnspecified BuildState = 0
	BuildQueued      BuildState = 1
	BuildRunning     BuildState = 2
	BuildSucceeded   BuildState = 3
	BuildFailed      BuildState = 4
	BuildCancelled   BuildState = 5
)

// String is the state's name in lower case ("queued", "running", …).
func (s BuildState) String() string {
	name, ok := buildv1.BuildState_name[int32(s)]
	if !ok {
		return fmt.Sprintf("build_state(%d)", int32(s))
	}
	return strings.ToLower(strings.TrimPrefix(name, "BUILD_STATE_"))
}

// Done reports whether the build ended (succeeded, failed or was cancelled).
func (s BuildState) Done() bool {
	return s == BuildSucceeded || s == BuildFailed || s == BuildCancelled
}

// BuildStep is one Dockerfile step as the builder reported it.
type BuildStep struct {
	Number      int32  // 1-based, FROM counted
	Instruction string // e.g. "RUN apt-get update"
	Cached      bool   // taken from the organization's layer cache
}

func stepFromProto(p *buildv1.BuildStep) *BuildStep {
	if p == nil {
		return nil
	}
	return &BuildStep{Number: p.GetNumber(), Instruction: p.GetInstruction(), Cached: p.GetCached()}
}

// Build is a build as last seen.
type Build struct {
	ID    string
	State BuildState
	// Exactly one of Template (a template display name) and Repository (name[:tag]) is
	// the target, as requested.
	Template   string
	Repository string
	// TemplateID and TemplateRevision: the template a SUCCEEDED template build made or
	// updated.
	TemplateID       string
	TemplateRevision int64
	// Image (`<registry>/<org>/<name>@sha256:…`) and ImageDigest: SUCCEEDED only.
	Image       string
	ImageDigest string
	Steps       []BuildStep // the steps seen so far
	TotalSteps  int32
	// FailedStep (nil unless a step failed), FailureReason and FailureMessage: FAILED.
	FailedStep     *BuildStep
	FailureReason  string
	FailureMessage string
	RunnerID       string
	Dockerfile     string
	BuilderSize    string
	CreatedAt      time.Time
	StartedAt      time.Time
	EndedAt        time.Time

	proto *buildv1.Build
}

// Proto returns the build message received.
func (b *Build) Proto() *buildv1.Build { return b.proto }

func buildFromProto(p *buildv1.Build) *Build {
	b := &Build{
		ID: p.GetBuildId(), State: BuildState(p.GetState()), Template: p.GetTemplate(), Repository: p.GetRepository(),
		TemplateID: p.GetTemplateId(), TemplateRevision: p.GetTemplateRevision(), Image: p.GetImage(), ImageDigest: p.GetImageDigest(),
		TotalSteps: p.GetTotalSteps(), FailedStep: stepFromProto(p.GetFailedStep()), FailureReason: p.GetFailureReason(),
		FailureMessage: p.GetFailureMessage(), RunnerID: p.GetRunnerId(), Dockerfile: p.GetDockerfile(), BuilderSize: p.GetBuilderSize(),
		proto: p,
	}
	for _, s := range p.GetSteps() {
		b.Steps = append(b.Steps, *stepFromProto(s))
	}
	if t := p.GetCreateTime(); t != nil {
		b.CreatedAt = t.AsTime()
	}
	if t := p.GetStartTime(); t != nil {
		b.StartedAt = t.AsTime()
	}
	if t := p.GetEndTime(); t != nil {
		b.EndedAt = t.AsTime()
	}
	return b
}

// BuildError is a build that ended FAILED or CANCELLED (BuildTemplate's, WaitBuild's
// and FollowBuild's error). errors.Is matches ErrBuildFailed or ErrBuildCancelled.
type BuildError struct {
	Build *Build
}

func (e *BuildError) Error() string {
	b := e.Build
	if b.State == BuildCancelled {
		return "build " + b.ID + " was cancelled"
	}
	var s strings.Builder
	s.WriteString("build " + b.ID + " failed")
	if st := b.FailedStep; st != nil {
		if b.TotalSteps > 0 {
			fmt.Fprintf(&s, " at step %d/%d", st.Number, b.TotalSteps)
		} else {
			fmt.Fprintf(&s, " at step %d", st.Number)
		}
		if st.Instruction != "" {
			s.WriteString(" (" + st.Instruction + ")")
		}
	}
	if b.FailureReason != "" {
		s.WriteString(": " + b.FailureReason)
	}
	if b.FailureMessage != "" {
		s.WriteString(": " + b.FailureMessage)
	}
	return s.String()
}

// Is matches ErrBuildFailed (state FAILED) or ErrBuildCancelled (CANCELLED).
func (e *BuildError) Is(target error) bool {
	return (target == ErrBuildFailed && e.Build.State == BuildFailed) ||
		(target == ErrBuildCancelled && e.Build.State == BuildCancelled)
}

// BuildTarget is where a build's image goes: exactly one field set.
type BuildTarget struct {
	// Template is a template display name: created when the organization has none,
	// else its container image is replaced by the built image (a template update).
	Template string
	// Repository is `name[:tag]` in the organization's repository of the platform
	// registry.
	Repository string
}

// BuildOptions are a build's options beyond its target and context.
type BuildOptions struct {
	// Dockerfile is the Dockerfile's path inside the context; "" = "Dockerfile".
	Dockerfile string
	// BuildArgs are Dockerfile ARG values (at most 64).
	BuildArgs map[string]string
	// TargetStage is the stage to stop at; "" = the last.
	TargetStage string
	// BuilderSize is one of the policy's builder sizes ("small", "medium", "large");
	// "" = the policy's default.
	BuilderSize string
	// Timeout is the build's lifetime; 0 = the policy's default (rounded up to seconds).
	Timeout time.Duration
	// NoCache builds without the organization's layer cache.
	NoCache bool
	// RequestID makes StartBuild idempotent; "" = a fresh one per call (retries of the
	// call reuse it).
	RequestID string
}

// StartBuild queues a build of the context archive (an fsarchive archive, see
// PackBuildContext) and returns it QUEUED. Transient failures are retried with the same
// request ID, so a retry never starts a second build. Needs the SANDBOX_ADMIN role.
// Errors: ErrInvalidArgument (with field violations), ErrBuildNotSupported (no runner
// can build), ErrResourceExhausted (the context exceeds the server's bound).
func (c *Client) StartBuild(ctx context.Context, target BuildTarget, contextArchive []byte, opts BuildOptions) (*Build, error) {
	req := &buildv1.StartBuildRequest{
		Dockerfile: opts.Dockerfile, Context: contextArchive, BuildArgs: opts.BuildArgs, TargetStage: opts.TargetStage,
		BuilderSize: opts.BuilderSize, NoCache: opts.NoCache, RequestId: opts.RequestID,
	}
	switch {
	case target.Template != "" && target.Repository != "":
		return nil, errors.New("sandbox: a build's target is a template or a repository, not both")
	case target.Template != "":
		req.Target = &buildv1.StartBuildRequest_Template{Template: target.Template}
	case target.Repository != "":
		req.Target = &buildv1.StartBuildRequest_Repository{Repository: target.Repository}
	default:
		return nil, errors.New("sandbox: a build needs a target: a template name or a repository")
	}
	if len(contextArchive) == 0 {
		return nil, errors.New("sandbox: a build needs a context archive (PackBuildContext)")
	}
	if opts.Timeout < 0 {
		return nil, errors.New("sandbox: a build's timeout must not be negative")
	}
	if opts.Timeout > 0 {
		req.TimeoutSeconds = int32(min(math.Ceil(opts.Timeout.Seconds()), math.MaxInt32))
	}
	if req.RequestId == "" {
		req.RequestId = newUUID()
	}
	var out *Build
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, createTimeout)
		defer cancel()
		res, err := c.build.StartBuild(cctx, connect.NewRequest(req))
		if err != nil {
			return fromRPC(err)
		}
		out = buildFromProto(res.Msg.GetBuild())
		return nil
	})
	return out, err
}

// GetBuild returns the build id of the caller's organization; a missing one is
// ErrBuildNotFound.
func (c *Client) GetBuild(ctx context.Context, id string) (*Build, error) {
	if id == "" {
		return nil, errors.New("sandbox: GetBuild needs a build ID")
	}
	var out *Build
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, getTimeout)
		defer cancel()
		res, err := c.build.GetBuild(cctx, connect.NewRequest(&buildv1.GetBuildRequest{BuildId: id}))
		if err != nil {
			return fromRPC(err)
		}
		out = buildFromProto(res.Msg.GetBuild())
		return nil
	})
	return out, err
}

// BuildListOptions filter ListBuilds.
type BuildListOptions struct {
	Template string // only builds of this template display name
	PageSize int32  // 0 = server default
}

// ListBuilds returns the organization's builds, newest first, following page tokens.
func (c *Client) ListBuilds(ctx context.Context, opts BuildListOptions) ([]*Build, error) {
	ctx, cancel := withTimeout(ctx, listTimeout)
	defer cancel()
	items, err := collectPages(ctx, maxListPages, func(ctx context.Context, token string) ([]*buildv1.Build, string, error) {
		var res *connect.Response[buildv1.ListBuildsResponse]
		err := retry(ctx, retryBudget, func(ctx context.Context) error {
			var err error
			res, err = c.build.ListBuilds(ctx, connect.NewRequest(&buildv1.ListBuildsRequest{
				PageSize: opts.PageSize, PageToken: token, Template: opts.Template,
			}))
			return fromRPC(err)
		})
		if err != nil {
			return nil, "", err
		}
		return res.Msg.GetBuilds(), res.Msg.GetNextPageToken(), nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Build, len(items))
	for i, p := range items {
		out[i] = buildFromProto(p)
	}
	return out, nil
}

// CancelBuild stops a QUEUED or RUNNING build (it ends CANCELLED) and returns it; a
// build that ended is returned as it is. A missing one is ErrBuildNotFound.
func (c *Client) CancelBuild(ctx context.Context, id string) (*Build, error) {
	if id == "" {
		return nil, errors.New("sandbox: CancelBuild needs a build ID")
	}
	var out *Build
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, getTimeout)
		defer cancel()
		res, err := c.build.CancelBuild(cctx, connect.NewRequest(&buildv1.CancelBuildRequest{BuildId: id}))
		if err != nil {
			return fromRPC(err)
		}
		out = buildFromProto(res.Msg.GetBuild())
		return nil
	})
	return out, err
}

// LogStream is the origin of a build log line.
type LogStream int32

// Log streams, numbered as in sandboxd.build.v1.LogLine.Stream.
const (
	LogStreamUnspecified LogStream = 0
	LogStreamStdout      LogStream = 1
	LogStreamStderr      LogStream = 2
	LogStreamSystem      LogStream = 3 // the platform's own lines (base pulled, pushing)
)

// String is the stream's name in lower case ("stdout", "stderr", "system").
func (s LogStream) String() string {
	name, ok := buildv1.LogLine_Stream_name[int32(s)]
	if !ok {
		return fmt.Sprintf("stream(%d)", int32(s))
	}
	return strings.ToLower(strings.TrimPrefix(name, "STREAM_"))
}

// BuildLogLine is one line of a build's output.
type BuildLogLine struct {
	Stream LogStream
	Step   int32  // the step it belongs to (0: before the first or after the last)
	Text   string // without its newline
}

// BuildEvent is one event of a build's log: exactly one of Line, Step (a step began)
// and Build (the build changed state; the last event of an ended build) is set.
type BuildEvent struct {
	Seq   int64 // increasing from 1 within a build
	Time  time.Time
	Line  *BuildLogLine
	Step  *BuildStep
	Build *Build

	proto *buildv1.BuildLogEvent
}

// Proto returns the event message received.
func (e BuildEvent) Proto() *buildv1.BuildLogEvent { return e.proto }

func buildEventFromProto(p *buildv1.BuildLogEvent) BuildEvent {
	e := BuildEvent{Seq: p.GetSeq(), proto: p}
	if t := p.GetTime(); t != nil {
		e.Time = t.AsTime()
	}
	switch x := p.GetEvent().(type) {
	case *buildv1.BuildLogEvent_Line:
		e.Line = &BuildLogLine{Stream: LogStream(x.Line.GetStream()), Step: x.Line.GetStep(), Text: x.Line.GetText()}
	case *buildv1.BuildLogEvent_Step:
		e.Step = stepFromProto(x.Step)
	case *buildv1.BuildLogEvent_Build:
		e.Build = buildFromProto(x.Build)
	}
	return e
}

// BuildLogOptions select what BuildLogs streams.
type BuildLogOptions struct {
	AfterSeq int64 // start after this event (0: from the beginning)
	Follow   bool  // keep streaming live events until the build ends
}

// maxLogResumes bounds how often a followed build log is reopened after a break.
const maxLogResumes = 3

// BuildLogs calls fn for each event of the build id's log, in order: the events kept so
// far and, with Follow, live ones until the build ends. It returns the build as the
// log's last event reported it (nil when the log held no build event, e.g. without
// Follow while the build runs). A followed stream that breaks is reopened after the
// last event seen, up to three times; one that ends before the build did is reopened
// too. An error from fn stops the stream and is returned. A missing build is
// ErrBuildNotFound.
func (c *Client) BuildLogs(ctx context.Context, id string, opts BuildLogOptions, fn func(BuildEvent) error) (*Build, error) {
	if id == "" {
		return nil, errors.New("sandbox: BuildLogs needs a build ID")
	}
	if !opts.Follow {
		var cancel context.CancelFunc
		ctx, cancel = withTimeout(ctx, defaultLogWait)
		defer cancel()
	}
	after := opts.AfterSeq
	var last *Build
	delay := 500 * time.Millisecond
	for resumes := 0; ; {
		progressed := false
		err := c.streamBuildLogs(ctx, id, after, opts.Follow, func(e BuildEvent) error {
			progressed = true
			after = e.Seq
			if e.Build != nil {
				last = e.Build
			}
			return fn(e)
		})
		var ferr *callbackError
		if errors.As(err, &ferr) {
			return last, ferr.err
		}
		if last != nil && last.State.Done() {
			return last, nil // the log's end: a break after it loses nothing
		}
		if !opts.Follow {
			return last, err
		}
		if err != nil && !resumable(err) {
			return last, err
		}
		// The stream broke, or ended before the build did: reopen after the last event.
		if !progressed {
			resumes++
		}
		if resumes > maxLogResumes {
			if err == nil {
				err = fmt.Errorf("sandbox: the log of build %s ended %d times before the build did", id, resumes)
			}
			return last, err
		}
		if serr := sleep(ctx, delay); serr != nil {
			return last, serr
		}
		delay = min(delay*2, 4*time.Second)
	}
}

// callbackError carries the caller's error out of a stream.
type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }

func (c *Client) streamBuildLogs(ctx context.Context, id string, after int64, follow bool, fn func(BuildEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.build.StreamBuildLogs(ctx, connect.NewRequest(&buildv1.StreamBuildLogsRequest{BuildId: id, AfterSeq: after, Follow: follow}))
	if err != nil {
		return fromRPC(err)
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
		e := stream.Msg().GetEvent()
		if e == nil || e.GetSeq() <= after {
			continue // nothing, or an event already seen
		}
		after = e.GetSeq()
		if err := fn(buildEventFromProto(e)); err != nil {
			return &callbackError{err}
		}
	}
	return fromRPC(stream.Err())
}

// FollowBuild follows the build id's log from event afterSeq + 1 until it ends, calling
// fn (nil: none) for each event, and returns the ended build: with a *BuildError when
// it FAILED or was CANCELLED. When ctx ends first, it returns ctx's error and leaves the
// build running (see BuildTemplate for cancelling).
func (c *Client) FollowBuild(ctx context.Context, id string, afterSeq int64, fn func(BuildEvent) error) (*Build, error) {
	if fn == nil {
		fn = func(BuildEvent) error { return nil }
	}
	b, err := c.BuildLogs(ctx, id, BuildLogOptions{AfterSeq: afterSeq, Follow: true}, fn)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return b, cerr
		}
		return b, err
	}
	if b == nil || !b.State.Done() {
		// The log ended without the final build: ask for it.
		if b, err = c.GetBuild(ctx, id); err != nil {
			return nil, err
		}
		if !b.State.Done() {
			return b, fmt.Errorf("sandbox: the log of build %s ended while it is %s", id, b.State)
		}
	}
	if b.State != BuildSucceeded {
		return b, &BuildError{Build: b}
	}
	return b, nil
}

// BuildTemplateOptions configure BuildTemplate.
type BuildTemplateOptions struct {
	BuildOptions
	// Pack bounds the context (its Dockerfile is BuildOptions.Dockerfile).
	Pack PackOptions
	// OnPacked, when set, is called with the packed context before it is sent.
	OnPacked func(*BuildContext)
	// OnStart, when set, is called with the build once it is queued.
	OnStart func(*Build)
	// OnEvent, when set, is called for each log event (steps, lines, state changes).
	OnEvent func(BuildEvent) error
	// LeaveRunning keeps the build going when ctx ends (by default BuildTemplate then
	// cancels it).
	LeaveRunning bool
}

// cancelTimeout bounds the CancelBuild BuildTemplate sends after its context ended.
const cancelTimeout = 15 * time.Second

// BuildTemplate builds the template name from the directory dir: it packs dir
// (PackBuildContext: the Dockerfile opts names, a .dockerignore honoured, symlinks
// stored as symlinks), starts the build, follows its log (opts.OnEvent) and returns the
// ended build; a build that FAILED or was CANCELLED is a *BuildError naming the failing
// step. When ctx ends first the build is cancelled (unless opts.LeaveRunning) and ctx's
// error returned with the build as last seen.
func (c *Client) BuildTemplate(ctx context.Context, name, dir string, opts BuildTemplateOptions) (*Build, error) {
	if name == "" {
		return nil, errors.New("sandbox: BuildTemplate needs a template name")
	}
	pack := opts.Pack
	pack.Dockerfile = opts.Dockerfile
	pc, err := PackBuildContext(ctx, dir, pack)
	if err != nil {
		return nil, err
	}
	opts.Dockerfile = pc.Dockerfile
	if opts.OnPacked != nil {
		opts.OnPacked(pc)
	}
	b, err := c.StartBuild(ctx, BuildTarget{Template: name}, pc.Archive, opts.BuildOptions)
	if err != nil {
		return nil, err
	}
	if opts.OnStart != nil {
		opts.OnStart(b)
	}
	final, err := c.FollowBuild(ctx, b.ID, 0, opts.OnEvent)
	if final == nil {
		final = b
	}
	if ctx.Err() != nil && !opts.LeaveRunning {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer cancel()
		cb, cerr := c.CancelBuild(cctx, b.ID)
		if cerr != nil {
			return final, errors.Join(ctx.Err(), fmt.Errorf("sandbox: cancelling build %s: %w", b.ID, cerr))
		}
		return cb, ctx.Err()
	}
	return final, err
}
