// Package relay implements the data RPCs of the public API (exec, stream exec, logs,
// files) by translating them to a sandbox's agent. The gateway serves them for every
// sandbox of an organization; a runner's direct data plane (internal/dataplane) serves
// them for its own sandboxes, to clients holding a data-plane certificate.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Limits of the public API: the size of its messages (the gateway's and the direct data
// plane's) and those of the data RPCs.
const (
	MaxMessageBytes    = 100 << 20 // the official client's channel limit
	MaxUnaryFileBytes  = 32 << 20  // larger files go through streaming exec
	defaultMaxExecSize = 16 << 20
)

// DataSource finds the agent behind a data call: the gateway looks the sandbox up in the
// caller's organization; a runner's direct data plane checks the caller's certificate.
type DataSource interface {
	// DataAgent returns the agent of sandbox id's container (the request's container
	// field; "" = the primary) for an operation needing perm, waiting while the sandbox
	// starts. A name of no container of the sandbox is NOT_FOUND
	// CWSANDBOX_CONTAINER_NOT_FOUND, metadata container naming it.
	DataAgent(ctx context.Context, perm sandboxv1.SandboxDataPermission, id, container string) (agentv1connect.AgentServiceClient, error)
	// DataLogs returns the reader of the log of sandbox id's container ("" = the
	// primary) (STREAM_LOGS), refusing a name of no container as DataAgent does. Logs
	// outlive the sandbox: an ended one's log is read from its runner's copy for the
	// retention window.
	DataLogs(ctx context.Context, id, container string) (LogReader, error)
}

// LogReader reads a sandbox's log as the agent's Logs call does (runner.Runner.Logs).
type LogReader func(ctx context.Context, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error

// Relay implements the data RPCs (exec, stream exec, logs, files) over a DataSource by
// translating them to the sandbox's agent. Their messages are the same in SandboxService
// and SandboxDataPlaneService, so a Relay serves the gateway's data RPCs and, on a runner,
// the direct data plane.
type Relay struct {
	sandboxv1connect.UnimplementedSandboxDataPlaneServiceHandler
	Src DataSource
}

var _ sandboxv1connect.SandboxDataPlaneServiceHandler = Relay{}

func (d Relay) Exec(ctx context.Context, req *connect.Request[sandboxv1.ExecRequest]) (*connect.Response[sandboxv1.ExecResponse], error) {
	m := req.Msg
	if vs := execViolations("command", "env", m.GetCommand(), m.GetEnv()); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid exec: "+apierr.Describe(vs), vs)
	}
	if m.GetMaxOutputBytes() < 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "max_output_bytes must not be negative", []apierr.Violation{{Field: "max_output_bytes", Description: "must not be negative"}})
	}
	a, err := d.Src.DataAgent(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC, m.GetSandboxId(), m.GetContainer())
	if err != nil {
		return nil, err
	}
	limit := int64(m.GetMaxOutputBytes())
	if limit == 0 {
		limit = defaultMaxExecSize
	}
	res, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: m.GetCommand(), Env: m.GetEnv(), MaxOutputBytes: limit}))
	if err != nil {
		return nil, relayError(m.GetSandboxId(), err)
	}
	r := res.Msg
	return connect.NewResponse(&sandboxv1.ExecResponse{
		Stdout: r.GetStdout(), Stderr: r.GetStderr(), ExitCode: r.GetExitCode(),
		StdoutTruncated: r.GetStdoutTruncated(), StderrTruncated: r.GetStderrTruncated(),
		StdoutBytesProduced: r.GetStdoutBytesProduced(), StderrBytesProduced: r.GetStderrBytesProduced(),
	}), nil
}

func (d Relay) WriteFile(ctx context.Context, req *connect.Request[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	m := req.Msg
	if n := len(m.GetContent()); n > MaxUnaryFileBytes {
		return nil, apierr.New(apierr.FileTooLarge,
			fmt.Sprintf("%s: %d bytes is larger than the %d bytes a unary write takes; stream it", m.GetPath(), n, MaxUnaryFileBytes),
			map[string]string{"filepath": m.GetPath(), "size_bytes": fmt.Sprint(n), "max_size_bytes": fmt.Sprint(MaxUnaryFileBytes)})
	}
	a, err := d.Src.DataAgent(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_WRITE_FILE, m.GetSandboxId(), m.GetContainer())
	if err != nil {
		return nil, err
	}
	err = writeFileStream(ctx, a, m.GetPath(), m.GetContent())
	if connect.CodeOf(err) == connect.CodeUnimplemented { // an agent or runner older than WriteFileStream
		_, err = a.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: m.GetPath(), Content: m.GetContent()}))
	}
	if err != nil {
		return nil, relayError(m.GetSandboxId(), err)
	}
	return connect.NewResponse(&sandboxv1.WriteFileResponse{}), nil
}

// fileChunkBytes is the most content a relayed WriteFileStream message carries.
const fileChunkBytes = 1 << 20

// writeFileStream sends content to the agent by WriteFileStream, in chunks that are
// slices of content (no copy but the message's).
func writeFileStream(ctx context.Context, a agentv1connect.AgentServiceClient, path string, content []byte) error {
	st := a.WriteFileStream(ctx)
	n := min(len(content), fileChunkBytes)
	err := st.Send(&agentv1.WriteFileChunk{Path: path, Size: int64(len(content)), Content: content[:n]})
	for off := n; err == nil && off < len(content); off += n {
		n = min(len(content)-off, fileChunkBytes)
		err = st.Send(&agentv1.WriteFileChunk{Content: content[off : off+n]})
	}
	// A send the agent refused fails with io.EOF; the agent's error is the response's.
	if _, cerr := st.CloseAndReceive(); cerr != nil {
		return cerr
	}
	return err
}

// readFileStream reads path from the agent by ReadFileStream into one buffer of the
// file's size, never more than MaxUnaryFileBytes whatever the agent (sandbox code)
// sends.
func readFileStream(ctx context.Context, a agentv1connect.AgentServiceClient, path string) ([]byte, error) {
	st, err := a.ReadFileStream(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: path, MaxBytes: MaxUnaryFileBytes}))
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.Close() }()
	var buf []byte
	for first := true; st.Receive(); first = false {
		m := st.Msg()
		if first {
			buf = make([]byte, 0, min(max(m.GetSize(), 0), MaxUnaryFileBytes))
		}
		if len(buf)+len(m.GetContent()) > MaxUnaryFileBytes {
			n := len(buf) + len(m.GetContent())
			return nil, apierr.New(apierr.FileTooLarge, fmt.Sprintf("read %s: file is over the limit of %d bytes", path, MaxUnaryFileBytes),
				map[string]string{"filepath": path, "size_bytes": fmt.Sprint(n), "max_size_bytes": fmt.Sprint(MaxUnaryFileBytes)})
		}
		buf = append(buf, m.GetContent()...)
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	if buf == nil {
		buf = []byte{}
	}
	return buf, nil
}

func (d Relay) ReadFile(ctx context.Context, req *connect.Request[sandboxv1.ReadFileRequest]) (*connect.Response[sandboxv1.ReadFileResponse], error) {
	m := req.Msg
	a, err := d.Src.DataAgent(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_READ_FILE, m.GetSandboxId(), m.GetContainer())
	if err != nil {
		return nil, err
	}
	content, err := readFileStream(ctx, a, m.GetPath())
	if connect.CodeOf(err) == connect.CodeUnimplemented { // an agent or runner older than ReadFileStream
		var res *connect.Response[agentv1.ReadFileResponse]
		if res, err = a.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: m.GetPath(), MaxBytes: MaxUnaryFileBytes})); err == nil {
			content = res.Msg.GetContent()
		}
	}
	if err != nil {
		return nil, relayError(m.GetSandboxId(), err)
	}
	return connect.NewResponse(&sandboxv1.ReadFileResponse{Content: content}), nil
}

// StreamExec relays an interactive command between the client and the sandbox's agent,
// message by message: nothing is buffered beyond a message, so a client that stops
// reading slows the command down (the agent reports STREAM_BACKPRESSURE if it must).
// The client's half-close is stdin EOF, not a cancellation.
func (d Relay) StreamExec(ctx context.Context, stream *connect.BidiStream[sandboxv1.ExecStreamRequest, sandboxv1.ExecStreamResponse]) error {
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
	if vs := execViolations("init.command", "init.env", init.GetCommand(), init.GetEnv()); vs != nil {
		return apierr.Invalid(apierr.InvalidRequest, "invalid exec: "+apierr.Describe(vs), vs)
	}
	a, err := d.Src.DataAgent(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_EXEC, init.GetSandboxId(), init.GetContainer())
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
				return apierr.Newf(apierr.SandboxNotRunning, "the command's stream ended without an exit status")
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

// StreamLogs streams the main command's output, also after the sandbox ended. Without
// follow it ends after what has been written so far; with follow it goes on until the
// main command ends (at once for an ended sandbox).
func (d Relay) StreamLogs(ctx context.Context, req *connect.Request[sandboxv1.StreamLogsRequest], stream *connect.ServerStream[sandboxv1.LogEntry]) error {
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
			return apierr.Invalid(apierr.InvalidRequest, "invalid resume request: "+apierr.Describe(vs), vs)
		}
	}
	if m.GetTailLines() < 0 {
		return apierr.Invalid(apierr.InvalidRequest, "tail_lines must not be negative", []apierr.Violation{{Field: "tail_lines", Description: "must not be negative"}})
	}
	read, err := d.Src.DataLogs(ctx, m.GetSandboxId(), m.GetContainer())
	if err != nil {
		return err
	}
	id := m.GetSandboxId()
	session := logSessionPrefix + id
	if resume && m.GetResumeLogSessionId() != session {
		return stream.Send(&sandboxv1.LogEntry{Error: &sandboxv1.LogStreamError{Code: "SESSION_NOT_FOUND", Message: "unknown log session " + m.GetResumeLogSessionId()}})
	}
	areq := &agentv1.LogsRequest{Follow: m.GetFollow(), TailLines: m.GetTailLines(), Since: m.GetSinceTime()}
	if resume {
		areq.Offset, areq.FromOffset = m.GetResumeLogOffset(), true
	}
	stamp := lineStamper{}
	var (
		sent    bool
		sendErr error
	)
	err = read(ctx, areq, func(c *agentv1.LogsResponse) error {
		data := c.GetData()
		if m.GetTimestamps() {
			data = stamp.stamp(data, c.GetTime().AsTime())
		}
		sendErr = stream.Send(&sandboxv1.LogEntry{Data: data, Timestamp: c.GetTime(), LogSessionId: session, NextLogOffset: c.GetNextOffset()})
		sent = true
		return sendErr
	})
	switch {
	case err == nil:
		return nil
	case sendErr != nil:
		return sendErr
	case resume && connect.CodeOf(err) == connect.CodeInvalidArgument:
		return stream.Send(&sandboxv1.LogEntry{LogSessionId: session, Error: &sandboxv1.LogStreamError{Code: "INVALID_RESUME_OFFSET", Message: err.Error()}})
	case ctx.Err() != nil:
		return ctx.Err()
	case !sent:
		// A runner's error, as runner.Runner.Logs returns it: the API error every runner
		// call answers with.
		return relayError(id, runner.APIError(id, err, runner.SpecField))
	}
	return stream.Send(&sandboxv1.LogEntry{LogSessionId: session, Error: &sandboxv1.LogStreamError{Code: "STREAM_INTERRUPTED", Message: err.Error()}})
}

// relayError passes the agent's API errors through and explains transport failures: an
// agent that is gone means the sandbox stopped under the call.
func relayError(id string, err error) error {
	if apierr.Reason(err) != "" {
		return err
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeInternal:
		return apierr.New(apierr.SandboxNotRunning,
			fmt.Sprintf("sandbox %s stopped during the call: %v", id, err), map[string]string{"sandbox_id": id})
	}
	return err
}

// execViolations checks an exec's argv and environment with the runtime's limits (the
// same as the main command's at create). cmdField and envField name them in the request.
func execViolations(cmdField, envField string, argv []string, env map[string]string) []apierr.Violation {
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	if len(argv) == 0 {
		add(cmdField, "is required")
	}
	runtime.CheckArgs(cmdField, argv, 0, 0, add)
	runtime.CheckEnv(envField, env, add)
	return vs
}
