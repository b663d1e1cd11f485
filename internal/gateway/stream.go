package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
)

type agentClient = agentv1connect.AgentServiceClient

// StreamExec relays an interactive command between the client and the sandbox's agent,
// message by message: nothing is buffered beyond a message, so a client that stops
// reading slows the command down (the agent reports STREAM_BACKPRESSURE if it must).
// The client's half-close is stdin EOF, not a cancellation.
func (s *Server) StreamExec(ctx context.Context, stream *connect.BidiStream[sandboxv1.ExecStreamRequest, sandboxv1.ExecStreamResponse]) error {
	first, err := stream.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return apierr.Invalid(apierr.InvalidRequest, "the first message must be init", []apierr.Violation{{Field: "init", Description: "is required first"}})
		}
		return err
	}
	init := first.GetInit()
	if init == nil {
		return apierr.Invalid(apierr.InvalidRequest, "the first message must be init", []apierr.Violation{{Field: "init", Description: "is required first"}})
	}
	if len(init.GetCommand()) == 0 {
		return apierr.Invalid(apierr.InvalidRequest, "command is required", []apierr.Violation{{Field: "init.command", Description: "is required"}})
	}
	a, err := s.agentFor(ctx, init.GetSandboxId(), init.GetContainer())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := a.StreamExec(ctx)
	defer func() { _ = up.CloseResponse() }()
	if err := up.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: &agentv1.StreamExecInit{
		Command: init.GetCommand(), Env: init.GetEnv(), Tty: init.GetTty(), TtyWidth: init.GetTtyWidth(), TtyHeight: init.GetTtyHeight(),
	}}}); err != nil {
		return relayError(init.GetSandboxId(), upstreamErr(up, err))
	}

	// Client -> agent.
	var once sync.Once
	closeStdin := func() {
		once.Do(func() {
			_ = up.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Close{Close: &agentv1.CloseStdin{}}})
		})
	}
	go func() {
		for {
			m, err := stream.Receive()
			if err != nil {
				if errors.Is(err, io.EOF) {
					closeStdin()
					return
				}
				cancel() // the client went away: the agent kills the command
				return
			}
			var out *agentv1.StreamExecRequest
			switch x := m.GetMessage().(type) {
			case *sandboxv1.ExecStreamRequest_Stdin:
				out = &agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Stdin{Stdin: x.Stdin}}
			case *sandboxv1.ExecStreamRequest_Resize:
				out = &agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Resize{Resize: &agentv1.Resize{Width: x.Resize.GetWidth(), Height: x.Resize.GetHeight()}}}
			case *sandboxv1.ExecStreamRequest_Close:
				closeStdin()
				continue
			default:
				continue
			}
			if err := up.Send(out); err != nil {
				return
			}
		}
	}()

	// Agent -> client.
	for {
		r, err := up.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return apierr.Newf(connect.CodeInternal, apierr.SandboxNotRunning, "the command's stream ended without an exit status")
			}
			return relayError(init.GetSandboxId(), err)
		}
		var out *sandboxv1.ExecStreamResponse
		done := false
		switch x := r.GetMessage().(type) {
		case *agentv1.StreamExecResponse_Ready:
			out = &sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Ready{Ready: &sandboxv1.ExecStreamReady{ReadyTime: x.Ready.GetTime()}}}
		case *agentv1.StreamExecResponse_Output:
			st := sandboxv1.ExecStreamOutput_STREAM_STDOUT
			if x.Output.GetStream() == agentv1.Stream_STREAM_STDERR {
				st = sandboxv1.ExecStreamOutput_STREAM_STDERR
			}
			out = &sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Output{Output: &sandboxv1.ExecStreamOutput{Stream: st, Data: x.Output.GetData()}}}
		case *agentv1.StreamExecResponse_Exit:
			out = &sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Exit{Exit: &sandboxv1.ExecStreamExit{ExitCode: x.Exit.GetExitCode(), CompletedTime: x.Exit.GetTime()}}}
			done = true
		case *agentv1.StreamExecResponse_Error:
			out = &sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Error{Error: &sandboxv1.ExecStreamError{Code: x.Error.GetCode(), Message: x.Error.GetMessage()}}}
		default:
			continue
		}
		if err := stream.Send(out); err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// upstreamErr prefers the agent's own error over a local send failure.
func upstreamErr(up *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse], err error) error {
	if _, rerr := up.Receive(); rerr != nil && !errors.Is(rerr, io.EOF) {
		return rerr
	}
	return err
}

// logSessionPrefix makes a log session ID from a sandbox ID: one session per sandbox,
// since the agent keeps one log from the first start on.
const logSessionPrefix = "logs-"

// StreamLogs streams the main command's output. Without follow it ends after what has
// been written so far; with follow it goes on until the main command ends.
func (s *Server) StreamLogs(ctx context.Context, req *connect.Request[sandboxv1.StreamLogsRequest], stream *connect.ServerStream[sandboxv1.LogEntry]) error {
	m := req.Msg
	resume := m.GetResumeLogSessionId() != ""
	if resume {
		var vs []apierr.Violation
		if !m.GetFollow() {
			vs = append(vs, apierr.Violation{Field: "follow", Description: "must be true to resume"})
		}
		if m.GetTailLines() != 0 || m.GetSinceTime() != nil || m.GetTimestamps() {
			vs = append(vs, apierr.Violation{Field: "resume_log_session_id", Description: "cannot be combined with tail_lines, since_time or timestamps"})
		}
		if len(vs) > 0 {
			return apierr.Invalid(apierr.InvalidRequest, "invalid resume request: "+describe(vs), vs)
		}
	}
	if m.GetTailLines() < 0 {
		return apierr.Invalid(apierr.InvalidRequest, "tail_lines must not be negative", []apierr.Violation{{Field: "tail_lines", Description: "must not be negative"}})
	}
	rec, r, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return err
	}
	if sb := s.current(ctx, rec, r); sb.State.Terminal() || sb.State == runner.StateTerminating {
		return apierr.New(connect.CodeFailedPrecondition, apierr.SandboxNotRunning,
			"sandbox "+rec.id+" is "+sb.State.String()+": its logs are no longer served", map[string]string{"sandbox_id": rec.id})
	}
	session := logSessionPrefix + rec.id
	if resume && m.GetResumeLogSessionId() != session {
		return stream.Send(&sandboxv1.LogEntry{Error: &sandboxv1.LogStreamError{Code: "SESSION_NOT_FOUND", Message: "unknown log session " + m.GetResumeLogSessionId()}})
	}
	a, err := s.agentOf(ctx, rec, r, m.GetContainer())
	if err != nil {
		return err
	}
	areq := &agentv1.LogsRequest{Follow: m.GetFollow(), TailLines: m.GetTailLines(), Since: m.GetSinceTime()}
	if resume {
		areq.Offset, areq.FromOffset = m.GetResumeLogOffset(), true
	}
	up, err := a.Logs(ctx, connect.NewRequest(areq))
	if err != nil {
		return relayError(rec.id, err)
	}
	defer func() { _ = up.Close() }()
	stamp := lineStamper{}
	for up.Receive() {
		c := up.Msg()
		data := c.GetData()
		if m.GetTimestamps() {
			data = stamp.stamp(data, c.GetTime().AsTime())
		}
		if err := stream.Send(&sandboxv1.LogEntry{Data: data, Timestamp: c.GetTime(), LogSessionId: session, NextLogOffset: c.GetNextOffset()}); err != nil {
			return err
		}
	}
	if err := up.Err(); err != nil {
		if resume && connect.CodeOf(err) == connect.CodeInvalidArgument {
			return stream.Send(&sandboxv1.LogEntry{LogSessionId: session, Error: &sandboxv1.LogStreamError{Code: "INVALID_RESUME_OFFSET", Message: err.Error()}})
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return stream.Send(&sandboxv1.LogEntry{LogSessionId: session, Error: &sandboxv1.LogStreamError{Code: "STREAM_INTERRUPTED", Message: err.Error()}})
	}
	return nil
}

// lineStamper prefixes every line with its ISO-8601 time and a space, remembering across
// chunks whether the next byte starts a line.
type lineStamper struct{ midLine bool }

func (l *lineStamper) stamp(data []byte, t time.Time) []byte {
	prefix := []byte(t.UTC().Format(time.RFC3339Nano) + " ")
	var b bytes.Buffer
	for len(data) > 0 {
		if !l.midLine {
			b.Write(prefix)
		}
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			b.Write(data)
			l.midLine = true
			break
		}
		b.Write(data[:i+1])
		data = data[i+1:]
		l.midLine = false
	}
	return b.Bytes()
}
