package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

const (
	// DefaultMaxOutputBytes is the per-stream cap of a unary exec.
	DefaultMaxOutputBytes = 16 << 20
	// maxExecOutput keeps both streams of a unary exec within one message.
	maxExecOutput = 48 << 20
	// StreamBufferBytes is how much output a stream exec buffers for a client that does
	// not read before it fails with STREAM_BACKPRESSURE and kills the command.
	StreamBufferBytes = 8 << 20
)

// Stream exec error codes.
const (
	StreamErrBackpressure = "STREAM_BACKPRESSURE"
	StreamErrStartFailed  = "START_FAILED"
)

type service struct {
	a *Agent
}

var _ agentv1connect.AgentServiceHandler = (*service)(nil)

func invalidArg(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

func (s *service) execDir(dir string) (string, error) {
	if dir == "" {
		return s.a.workDir, nil
	}
	p, err := s.a.resolvePath(dir)
	if err != nil {
		return "", invalidPath(dir, err)
	}
	return p, nil
}

// capBuf keeps the first limit bytes written and counts all of them.
type capBuf struct {
	buf       []byte
	limit     int64
	produced  int64
	truncated bool
}

func (c *capBuf) write(b []byte) {
	c.produced += int64(len(b))
	room := c.limit - int64(len(c.buf))
	if int64(len(b)) > room {
		b = b[:max(room, 0)]
		c.truncated = true
	}
	c.buf = append(c.buf, b...)
}

func (s *service) Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	if err := s.requireFiles(ctx); err != nil {
		return nil, err
	}
	m := req.Msg
	if len(m.Command) == 0 {
		return nil, invalidArg("command is required")
	}
	if m.MaxOutputBytes < 0 {
		return nil, invalidArg("max_output_bytes must not be negative")
	}
	limit := m.MaxOutputBytes
	if limit == 0 {
		limit = DefaultMaxOutputBytes
	}
	limit = min(limit, maxExecOutput)
	dir, err := s.execDir(m.WorkingDir)
	if err != nil {
		return nil, err
	}
	callCtx := ctx
	if m.Timeout != nil {
		if err := m.Timeout.CheckValid(); err != nil || m.Timeout.AsDuration() < 0 {
			return nil, invalidArg("invalid timeout")
		}
		if d := m.Timeout.AsDuration(); d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
	}

	stdin := s.a.devNull
	var inW *os.File
	if len(m.Stdin) > 0 {
		if stdin, inW, err = os.Pipe(); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	p, err := startProc(procSpec{
		argv: m.Command, env: s.a.env(m.Env), dir: dir, cred: s.a.user.cred,
		files: [3]*os.File{stdin, outW, errW},
	})
	outW.Close()
	errW.Close()
	if inW != nil {
		stdin.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		if inW != nil {
			inW.Close()
		}
		var se *startError
		if errors.As(err, &se) {
			return connect.NewResponse(&agentv1.ExecResponse{
				ExitCode: se.code, Stderr: []byte("sandbox-agent: " + se.msg + "\n"),
				StderrBytesProduced: int64(len(se.msg) + 15),
			}), nil
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	s.a.trackExec(p, true)
	defer s.a.trackExec(p, false)
	stopKill := context.AfterFunc(ctx, func() { p.kill(syscall.SIGKILL) })
	defer stopKill()

	if inW != nil {
		go func() {
			go func() {
				<-p.exitedCh
				time.Sleep(s.a.outGrace)
				_ = inW.SetWriteDeadline(time.Now())
			}()
			_, _ = inW.Write(m.Stdin)
			inW.Close()
		}()
	}
	stdout := capBuf{limit: limit}
	stderr := capBuf{limit: limit}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); drain(outR, p.exitedCh, s.a.outGrace, stdout.write); outR.Close() }()
	go func() { defer wg.Done(); drain(errR, p.exitedCh, s.a.outGrace, stderr.write); errR.Close() }()
	code := p.wait()
	wg.Wait()
	if err := callCtx.Err(); err != nil {
		return nil, connect.NewError(connect.CodeOf(err), err)
	}
	return connect.NewResponse(&agentv1.ExecResponse{
		Stdout: stdout.buf, Stderr: stderr.buf, ExitCode: code,
		StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated,
		StdoutBytesProduced: stdout.produced, StderrBytesProduced: stderr.produced,
	}), nil
}

// outQueue buffers stream exec responses between the output readers and the sender.
// When limit bytes wait unsent, output blocks, so the readers stop reading and the
// command blocks on its writes: a slow client slows the command down. Only a client that
// takes nothing for stall fails the stream with STREAM_BACKPRESSURE.
type outQueue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	items      []*agentv1.StreamExecResponse
	bytes      int
	limit      int
	stall      time.Duration
	lastPop    time.Time
	overflowed bool
	final      bool
	onOverflow func()
}

func newOutQueue(limit int, stall time.Duration, onOverflow func()) *outQueue {
	q := &outQueue{limit: limit, stall: stall, lastPop: time.Now(), onOverflow: onOverflow}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *outQueue) output(stream agentv1.Stream, b []byte) {
	q.mu.Lock()
	for !q.overflowed && !q.final && q.bytes > 0 && q.bytes+len(b) > q.limit {
		wait := q.stall - time.Since(q.lastPop)
		if wait <= 0 {
			q.overflowed = true
			q.items = append(q.items[:0], errResp(StreamErrBackpressure,
				fmt.Sprintf("client read nothing for %s with %d bytes of output waiting; command killed", q.stall, q.bytes)))
			q.bytes = 0
			q.cond.Broadcast()
			q.mu.Unlock()
			q.onOverflow()
			return
		}
		t := time.AfterFunc(wait, func() {
			q.mu.Lock()
			q.cond.Broadcast()
			q.mu.Unlock()
		})
		q.cond.Wait()
		t.Stop()
	}
	if q.overflowed || q.final {
		q.mu.Unlock()
		return
	}
	q.bytes += len(b)
	if n := len(q.items); n > 0 {
		if o := q.items[n-1].GetOutput(); o != nil && o.Stream == stream && len(o.Data) < 64<<10 {
			o.Data = append(o.Data, b...)
			q.mu.Unlock()
			return
		}
	}
	q.items = append(q.items, &agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Output{
		Output: &agentv1.Output{Stream: stream, Data: append([]byte(nil), b...)}}})
	q.cond.Broadcast()
	q.mu.Unlock()
}

func (q *outQueue) push(r *agentv1.StreamExecResponse, final bool) {
	q.mu.Lock()
	q.items = append(q.items, r)
	q.final = q.final || final
	q.cond.Broadcast()
	q.mu.Unlock()
}

func (q *outQueue) pop() *agentv1.StreamExecResponse {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 {
		q.cond.Wait()
	}
	r := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	if o := r.GetOutput(); o != nil {
		q.bytes -= len(o.Data)
	}
	q.lastPop = time.Now()
	q.cond.Broadcast() // a reader may wait for room
	return r
}

func errResp(code, msg string) *agentv1.StreamExecResponse {
	return &agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Error{Error: &agentv1.StreamError{Code: code, Message: msg}}}
}

func exitResp(code int32) *agentv1.StreamExecResponse {
	return &agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Exit{Exit: &agentv1.Exit{ExitCode: code, Time: timestamppb.Now()}}}
}

type output struct {
	f      *os.File
	stream agentv1.Stream
}

func (s *service) StreamExec(ctx context.Context, st *connect.BidiStream[agentv1.StreamExecRequest, agentv1.StreamExecResponse]) error {
	if err := s.requireFiles(ctx); err != nil {
		return err
	}
	first, err := st.Receive()
	if errors.Is(err, io.EOF) {
		return invalidArg("the first message must be init")
	}
	if err != nil {
		return err
	}
	init := first.GetInit()
	if init == nil {
		return invalidArg("the first message must be init")
	}
	if len(init.Command) == 0 {
		return invalidArg("command is required")
	}
	dir, err := s.execDir(init.WorkingDir)
	if err != nil {
		return err
	}
	env := s.a.env(init.Env)

	var (
		files    [3]*os.File
		child    []*os.File // closed in the parent after the start
		stdinW   *os.File
		master   *os.File
		outs     []output
		closeAll = func() {}
	)
	if init.Tty {
		m, slave, err := pty.Open()
		if err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("open pty: %w", err))
		}
		if init.TtyWidth > 0 && init.TtyHeight > 0 {
			_ = pty.Setsize(m, &pty.Winsize{Cols: uint16(init.TtyWidth), Rows: uint16(init.TtyHeight)})
		}
		if !hasEnv(env, "TERM") {
			env = append(env, "TERM=xterm")
		}
		master, stdinW = m, m
		files = [3]*os.File{slave, slave, slave}
		child = []*os.File{slave}
		outs = []output{{m, agentv1.Stream_STREAM_STDOUT}}
		closeAll = func() { m.Close() }
	} else {
		var pipes [6]*os.File
		for i := 0; i < 6; i += 2 {
			if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
				for _, f := range pipes {
					if f != nil {
						f.Close()
					}
				}
				return connect.NewError(connect.CodeInternal, err)
			}
		}
		files = [3]*os.File{pipes[0], pipes[3], pipes[5]}
		child = files[:]
		stdinW = pipes[1]
		outs = []output{{pipes[2], agentv1.Stream_STREAM_STDOUT}, {pipes[4], agentv1.Stream_STREAM_STDERR}}
		closeAll = func() { pipes[1].Close(); pipes[2].Close(); pipes[4].Close() }
	}
	p, err := startProc(procSpec{argv: init.Command, env: env, dir: dir, cred: s.a.user.cred, files: files, tty: init.Tty})
	for _, f := range child {
		f.Close()
	}
	if err != nil {
		closeAll()
		var se *startError
		code := int32(126)
		if errors.As(err, &se) {
			code = se.code
		}
		if err := st.Send(errResp(StreamErrStartFailed, err.Error())); err != nil {
			return err
		}
		return st.Send(exitResp(code))
	}
	s.a.trackExec(p, true)
	defer s.a.trackExec(p, false)
	// The client going away (or the call ending) kills the command.
	stopKill := context.AfterFunc(ctx, func() { p.kill(syscall.SIGKILL) })
	defer stopKill()

	q := newOutQueue(StreamBufferBytes, s.a.streamStall, func() { p.kill(syscall.SIGKILL) })
	q.push(&agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Ready{Ready: &agentv1.Ready{Time: timestamppb.Now(), Pid: int32(p.pid)}}}, false)

	var stdinMu sync.Mutex
	stdinClosed := false
	closeStdin := func() {
		stdinMu.Lock()
		defer stdinMu.Unlock()
		if stdinClosed {
			return
		}
		if master != nil {
			_, _ = master.Write([]byte{4}) // VEOF: a pty cannot be half-closed
			return
		}
		stdinClosed = true
		stdinW.Close()
	}
	go func() {
		for {
			msg, err := st.Receive()
			if err != nil {
				if errors.Is(err, io.EOF) {
					closeStdin() // the client closed its side: EOF, keep running
				} else {
					p.kill(syscall.SIGKILL)
				}
				return
			}
			switch m := msg.Message.(type) {
			case *agentv1.StreamExecRequest_Stdin:
				stdinMu.Lock()
				if !stdinClosed {
					_, _ = stdinW.Write(m.Stdin)
				}
				stdinMu.Unlock()
			case *agentv1.StreamExecRequest_Resize:
				if master != nil && m.Resize.Width > 0 && m.Resize.Height > 0 {
					_ = pty.Setsize(master, &pty.Winsize{Cols: uint16(m.Resize.Width), Rows: uint16(m.Resize.Height)})
				}
			case *agentv1.StreamExecRequest_Close:
				closeStdin()
			}
		}
	}()

	var wg sync.WaitGroup
	for _, o := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			drain(o.f, p.exitedCh, s.a.outGrace, func(b []byte) { q.output(o.stream, b) })
		}()
	}
	go func() {
		code := p.wait()
		wg.Wait()
		_ = stdinW.SetWriteDeadline(time.Now()) // unblock a write nobody will read
		stdinMu.Lock()
		stdinClosed = true
		stdinMu.Unlock()
		closeAll()
		q.push(exitResp(code), true)
	}()

	var sendErr error
	for {
		r := q.pop()
		if sendErr == nil {
			if sendErr = st.Send(r); sendErr != nil {
				p.kill(syscall.SIGKILL)
			}
		}
		if r.GetExit() != nil {
			return sendErr
		}
	}
}

func (s *service) ReadFile(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	if err := s.requireFiles(ctx); err != nil {
		return nil, err
	}
	b, err := s.a.readFile(req.Msg.Path, req.Msg.MaxBytes)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&agentv1.ReadFileResponse{Content: b}), nil
}

func (s *service) WriteFile(ctx context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	if err := s.requireFiles(ctx); err != nil {
		return nil, err
	}
	if err := s.a.writeFile(req.Msg.Path, req.Msg.Content, req.Msg.Mode); err != nil {
		return nil, err
	}
	return connect.NewResponse(&agentv1.WriteFileResponse{}), nil
}

func (s *service) ReadFileStream(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest], st *connect.ServerStream[agentv1.ReadFileChunk]) error {
	if err := s.requireFiles(ctx); err != nil {
		return err
	}
	return s.a.readFileStream(req.Msg.Path, req.Msg.MaxBytes, func(b []byte, size int64) error {
		return st.Send(&agentv1.ReadFileChunk{Content: b, Size: size})
	})
}

func (s *service) WriteFileStream(ctx context.Context, st *connect.ClientStream[agentv1.WriteFileChunk]) (*connect.Response[agentv1.WriteFileResponse], error) {
	if err := s.requireFiles(ctx); err != nil {
		return nil, err
	}
	if !st.Receive() {
		if err := st.Err(); err != nil {
			return nil, err
		}
		return nil, apierr.Invalid(apierr.InvalidRequest, "the first message must name the path", []apierr.Violation{{Field: "path", Description: "is required"}})
	}
	first := st.Msg()
	next := func() ([]byte, error) {
		if !st.Receive() {
			if err := st.Err(); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		return st.Msg().GetContent(), nil
	}
	if err := s.a.writeFileStream(first.GetPath(), first.GetMode(), first.GetSize(), first.GetContent(), next); err != nil {
		return nil, err
	}
	return connect.NewResponse(&agentv1.WriteFileResponse{}), nil
}

func (s *service) Logs(ctx context.Context, req *connect.Request[agentv1.LogsRequest], st *connect.ServerStream[agentv1.LogsResponse]) error {
	return ReadLogs(ctx, s.a.logDir, s.a.logw, req.Msg, st.Send)
}

func (s *service) Status(ctx context.Context, req *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	st, _, _, _ := s.a.snapshot()
	return connect.NewResponse(st), nil
}

func (s *service) Watch(ctx context.Context, req *connect.Request[agentv1.WatchRequest], st *connect.ServerStream[agentv1.StatusResponse]) error {
	var sent uint64
	for {
		status, ver, changed, done := s.a.snapshot()
		if ver != sent {
			if err := st.Send(status); err != nil {
				return err
			}
			sent = ver
		}
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-s.a.done:
		case <-ctx.Done():
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

func (s *service) requireStarted() error {
	if !s.a.started.Load() {
		return connect.NewError(connect.CodeFailedPrecondition, errNotStarted)
	}
	return nil
}

// requireFiles is requireStarted, then waits until the spec's files are written (they
// are written as the main command first starts, while the agent already answers).
func (s *service) requireFiles(ctx context.Context) error {
	if err := s.requireStarted(); err != nil {
		return err
	}
	select {
	case <-s.a.filesDone:
		return nil
	case <-ctx.Done():
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("waiting for the sandbox's files: %w", ctx.Err()))
	}
}

// Stop implements the Stop RPC (agent.proto): the main command is stopped, killed after
// grace (at most maxStopGrace), and the agent ends.
func (s *service) Stop(_ context.Context, req *connect.Request[agentv1.StopRequest]) (*connect.Response[agentv1.StopResponse], error) {
	grace := req.Msg.GetGrace().AsDuration()
	if grace < 0 {
		return nil, invalidArg("grace: negative")
	}
	s.a.stop(min(grace, maxStopGrace))
	return connect.NewResponse(&agentv1.StopResponse{}), nil
}

// maxStopGrace bounds a Stop call's grace (a sandbox's longest termination grace).
const maxStopGrace = 10 * time.Minute

func (s *service) Start(ctx context.Context, req *connect.Request[agentv1.StartRequest]) (*connect.Response[agentv1.StartResponse], error) {
	var cfg agentconfig.Config
	if err := json.Unmarshal(req.Msg.Config, &cfg); err != nil {
		return nil, invalidArg("config: %v", err)
	}
	if err := s.a.start(&cfg); err != nil {
		if errors.Is(err, errAlreadyStarted) {
			return nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
		return nil, invalidArg("config: %v", err)
	}
	return connect.NewResponse(&agentv1.StartResponse{}), nil
}
