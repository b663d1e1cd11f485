package runnerapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// builder is what Build needs of the runner (runner.Local); a backend without it builds
// no images.
type builder interface {
	Build(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error)
}

func (a admitting) Build(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
	return a.l.Build(ctx, req, emit)
}

// Build runs one image build (runner.Local.Build) and streams its events; the result is
// the last message.
func (s *Server) Build(ctx context.Context, req *connect.Request[runnerv1.BuildRequest], stream *connect.ServerStream[runnerv1.BuildResponse]) error {
	b, ok := s.r.(builder)
	if !ok {
		return apierr.New(apierr.BuildNotSupported, "runner "+s.runnerID+" builds no images", nil)
	}
	m := req.Msg
	br := runner.BuildRequest{
		Options: imagebuild.Options{Dockerfile: m.GetDockerfile(), BuildArgs: m.GetBuildArgs(), Target: m.GetTargetStage(), NoCache: m.GetNoCache()},
		Context: bytes.NewReader(m.GetContext()), ContextLimits: runtime.ArchiveLimits{MaxBytes: m.GetContextMaxBytes(), MaxFiles: m.GetContextMaxFiles()},
		Push: m.GetPush(), PushUsername: m.GetPushCredentials().GetUsername(), PushPassword: m.GetPushCredentials().GetPassword(),
		PushInsecure: m.GetPushInsecure(), BaseCredentialsRegistry: m.GetBaseCredentialsRegistry(),
		Resources: resourcesFromProto(m.GetResources()), Timeout: m.GetTimeout().AsDuration(),
		OrganizationID: m.GetOrganizationId(),
	}
	if c := m.GetBaseCredentials(); c != nil {
		br.BaseCredentials = &runtime.Credentials{Username: c.GetUsername(), Password: c.GetPassword()}
	}
	var sendErr error
	res, err := b.Build(ctx, br, func(ev imagebuild.Event) {
		if sendErr != nil {
			return
		}
		var msg runnerv1.BuildResponse
		if ev.Step != nil {
			msg.Message = &runnerv1.BuildResponse_Step{Step: stepToProto(*ev.Step)}
		} else {
			msg.Message = &runnerv1.BuildResponse_Line{Line: &runnerv1.BuildLine{Stream: runnerv1.BuildLine_Stream(ev.Stream), Step: int32(ev.InStep), Text: ev.Line}}
		}
		sendErr = stream.Send(&msg)
	})
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return ce
		}
		return toStatus("", err)
	}
	if sendErr != nil {
		return sendErr
	}
	if res == nil || res.Result == nil {
		return connect.NewError(connect.CodeInternal, errors.New("the build returned no result"))
	}
	out := &runnerv1.BuildResult{ExitCode: res.ExitCode, Failure: res.Why, ImageDigest: res.Digest, Bases: res.Bases}
	for _, st := range res.Steps {
		out.Steps = append(out.Steps, stepToProto(st))
	}
	if res.Failed != nil {
		out.FailedStep = stepToProto(*res.Failed)
	}
	return stream.Send(&runnerv1.BuildResponse{Message: &runnerv1.BuildResponse_Result{Result: out}})
}

func stepToProto(s imagebuild.Step) *runnerv1.BuildStep {
	return &runnerv1.BuildStep{Number: int32(s.Number), Total: int32(s.Total), Instruction: s.Instruction, Cached: s.Cached}
}

// Build runs one build on the runner (its Build RPC), passing its events to emit as
// they arrive. The context is read whole into the request (the caller bounds it).
func (c *Client) Build(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
	var ctxBytes []byte
	if req.Context != nil {
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(io.LimitReader(req.Context, MaxMessageBytes+1)); err != nil {
			return nil, err
		}
		if buf.Len() > MaxMessageBytes {
			return nil, apierr.Invalid(apierr.InvalidRequest, "build context too large", []apierr.Violation{{Field: "context",
				Description: fmt.Sprintf("more than %d bytes", MaxMessageBytes)}})
		}
		ctxBytes = buf.Bytes()
	}
	m := &runnerv1.BuildRequest{
		Dockerfile: req.Dockerfile, BuildArgs: req.BuildArgs, TargetStage: req.Target, NoCache: req.NoCache,
		Context: ctxBytes, ContextMaxBytes: req.ContextLimits.MaxBytes, ContextMaxFiles: req.ContextLimits.MaxFiles,
		Push: req.Push, PushCredentials: &runnerv1.Credentials{Username: req.PushUsername, Password: req.PushPassword},
		PushInsecure: req.PushInsecure, BaseCredentialsRegistry: req.BaseCredentialsRegistry,
		Resources: resourcesToProto(req.Resources), Timeout: durationpb.New(req.Timeout),
		OrganizationId: req.OrganizationID,
	}
	if bc := req.BaseCredentials; bc != nil {
		m.BaseCredentials = &runnerv1.Credentials{Username: bc.Username, Password: bc.Password}
	}
	stream, err := c.runner.Build(ctx, connect.NewRequest(m))
	if err != nil {
		return nil, fromStatus(ctx, c.id, err)
	}
	defer func() { _ = stream.Close() }()
	if emit == nil {
		emit = func(imagebuild.Event) {}
	}
	steps := 0
	for stream.Receive() {
		switch msg := stream.Msg().Message.(type) {
		case *runnerv1.BuildResponse_Step:
			// A build has at most imagebuild.MaxSteps steps, each numbered 1 to its total
			// (imagebuild.Steps): the gateway keeps every step event it is sent.
			if steps++; steps > imagebuild.MaxSteps {
				return nil, badReply(c.id, "build: more than %d steps", imagebuild.MaxSteps)
			}
			if err := checkStep(msg.Step); err != nil {
				return nil, badReply(c.id, "build: %v", err)
			}
			st := stepFromProto(msg.Step)
			emit(imagebuild.Event{Step: &st, InStep: st.Number})
		case *runnerv1.BuildResponse_Line:
			emit(imagebuild.Event{Stream: imagebuild.Stream(msg.Line.GetStream()), InStep: int(msg.Line.GetStep()),
				Line: imagebuild.Clip(msg.Line.GetText(), imagebuild.MaxLine)})
		case *runnerv1.BuildResponse_Result:
			r := msg.Result
			if len(r.GetSteps()) > imagebuild.MaxSteps {
				return nil, badReply(c.id, "build: a result of %d steps, at most %d", len(r.GetSteps()), imagebuild.MaxSteps)
			}
			for _, st := range r.GetSteps() { // (the failed step may be unnumbered: imagebuild.Steps.Failed)
				if err := checkStep(st); err != nil {
					return nil, badReply(c.id, "build result: %v", err)
				}
			}
			res := &runner.BuildResult{Result: &imagebuild.Result{ExitCode: r.GetExitCode(), Why: r.GetFailure(), Bases: r.GetBases()}, Digest: r.GetImageDigest()}
			for _, s := range r.GetSteps() {
				res.Steps = append(res.Steps, stepFromProto(s))
			}
			if r.FailedStep != nil {
				f := stepFromProto(r.FailedStep)
				res.Failed = &f
			}
			return res, nil
		}
	}
	if err := stream.Err(); err != nil {
		return nil, fromStatus(ctx, c.id, err)
	}
	return nil, fmt.Errorf("runner %s: the build ended without a result", c.id)
}

// checkStep: a step numbered 1 to its total.
func checkStep(s *runnerv1.BuildStep) error {
	if n, total := s.GetNumber(), s.GetTotal(); n < 1 || n > total {
		return fmt.Errorf("step %d of %d", n, total)
	}
	return nil
}

func stepFromProto(s *runnerv1.BuildStep) imagebuild.Step {
	return imagebuild.Step{Number: int(s.GetNumber()), Total: int(s.GetTotal()), Instruction: imagebuild.Clip(s.GetInstruction(), imagebuild.MaxInstruction), Cached: s.GetCached()}
}
