package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// ExecOptions configure Exec. Output not wanted may be left nil.
type ExecOptions struct {
	// Stdin is streamed to the command in 64 KiB chunks once it is ready; its EOF
	// closes the command's stdin. Nil gives the command an empty stdin.
	Stdin          io.Reader
	Stdout, Stderr io.Writer // with TTY everything arrives on Stdout
	Env            map[string]string
	// Cwd runs the command in this directory (via /bin/sh, like the official client).
	Cwd string
	// TTY gives the command a pseudo-terminal of Width×Height, resized by the values
	// received on Resize.
	TTY           bool
	Width, Height uint32
	Resize        <-chan [2]uint32
	// ReadyTimeout bounds the wait for the server's ready message before stdin is sent
	// (default 60 s; stdin is sent anyway after it).
	ReadyTimeout time.Duration
	// Container runs the command in this container of a multi-container sandbox
	// (default: the handle's, see InContainer; else the primary).
	Container string
}

// Exec runs argv in the sandbox over StreamExec, streaming output as it arrives, and
// returns the command's exit code. It waits for the sandbox to run first. A command
// that cannot start returns the exit code a shell would give (127 not found, 126 not
// executable) with an *Error of reason ReasonStartFailed saying why.
func (s *Sandbox) Exec(ctx context.Context, argv []string, opts ExecOptions) (int, error) {
	if len(argv) == 0 {
		return -1, errors.New("sandbox: exec needs a command")
	}
	if err := s.ensureRunning(ctx); err != nil {
		return -1, err
	}
	if opts.Cwd != "" {
		argv = []string{"/bin/sh", "-c", "cd " + shellQuote(opts.Cwd) + " && exec " + shellJoin(argv)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dc, err := s.data(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_EXEC)
	if err != nil {
		return -1, err
	}
	stream := dc.StreamExec(ctx)
	defer func() { _ = stream.CloseResponse() }()

	var sendMu sync.Mutex
	send := func(m *sandboxv1.ExecStreamRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	init := &sandboxv1.ExecStreamInit{SandboxId: s.id, Command: argv, Env: opts.Env, Tty: opts.TTY, TtyWidth: opts.Width, TtyHeight: opts.Height,
		Container: s.target(opts.Container)}
	if err := send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Init{Init: init}}); err != nil && !errors.Is(err, io.EOF) {
		return -1, fromRPC(err)
	}
	ready := make(chan struct{})
	interactive := opts.Stdin != nil || opts.Resize != nil
	if !interactive {
		// Half-close at once: the server treats it as stdin EOF and runs the command on.
		if err := stream.CloseRequest(); err != nil {
			return -1, fromRPC(err)
		}
	} else {
		go s.pump(ctx, send, stream.CloseRequest, ready, opts)
	}

	stdout, stderr := orDiscard(opts.Stdout), orDiscard(opts.Stderr)
	readyOnce := sync.Once{}
	var startErr error // a START_FAILED error, until the exit code that follows it
	for {
		res, err := stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				if startErr != nil {
					return -1, startErr
				}
				return 0, nil // the official client reads a stream without exit as 0
			}
			return -1, fromRPC(err)
		}
		switch m := res.GetMessage().(type) {
		case *sandboxv1.ExecStreamResponse_Ready:
			readyOnce.Do(func() { close(ready) })
		case *sandboxv1.ExecStreamResponse_Output:
			w := stdout
			if m.Output.GetStream() == sandboxv1.ExecStreamOutput_STREAM_STDERR {
				w = stderr
			}
			if _, err := w.Write(m.Output.GetData()); err != nil {
				return -1, fmt.Errorf("sandbox: writing exec output: %w", err)
			}
		case *sandboxv1.ExecStreamResponse_Exit:
			return int(m.Exit.GetExitCode()), startErr
		case *sandboxv1.ExecStreamResponse_Error:
			err := &Error{Code: connect.CodeAborted, Reason: m.Error.GetCode(), Message: "exec stream: " + m.Error.GetMessage()}
			if err.Reason != ReasonStartFailed {
				return -1, err
			}
			err.Code, err.Message = connect.CodeFailedPrecondition, m.Error.GetMessage()
			startErr = err
		}
	}
}

// pump sends stdin (after ready) and resizes until both are done or ctx ends.
func (s *Sandbox) pump(ctx context.Context, send func(*sandboxv1.ExecStreamRequest) error, closeRequest func() error, ready <-chan struct{}, opts ExecOptions) {
	timeout := opts.ReadyTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
		return
	case <-t.C:
		// No ready: send anyway; the server buffers nothing but the stream still works.
	}
	var wg sync.WaitGroup
	if opts.Stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, stdinChunk)
			for {
				n, err := opts.Stdin.Read(buf)
				if n > 0 {
					chunk := append([]byte(nil), buf[:n]...)
					if send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Stdin{Stdin: chunk}}) != nil {
						return
					}
				}
				if err != nil {
					_ = send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Close{Close: &sandboxv1.ExecStreamClose{}}})
					return
				}
				if ctx.Err() != nil {
					return
				}
			}
		}()
	} else {
		_ = send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Close{Close: &sandboxv1.ExecStreamClose{}}})
	}
	if opts.Resize != nil {
		for {
			select {
			case <-ctx.Done():
				return
			case sz, ok := <-opts.Resize:
				if !ok {
					wg.Wait()
					_ = closeRequest()
					return
				}
				_ = send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Resize{Resize: &sandboxv1.ExecStreamResize{Width: sz[0], Height: sz[1]}}})
			}
		}
	}
	wg.Wait()
	_ = closeRequest()
}

// UnaryExecOptions configure ExecUnary.
type UnaryExecOptions struct {
	Env map[string]string
	// MaxOutputBytes caps each of stdout and stderr; 0 = the server's default.
	MaxOutputBytes int32
	// Container runs the command in this container (default: the handle's, else the
	// primary).
	Container string
}

// ExecResult is what ExecUnary returns: the output (cut at the cap) and the exit code.
type ExecResult struct {
	Stdout, Stderr                   []byte
	ExitCode                         int
	StdoutTruncated, StderrTruncated bool
	// StdoutBytes and StderrBytes count all output produced, including what was cut.
	StdoutBytes, StderrBytes int64
}

// ExecUnary runs argv by the unary Exec call: no stdin, output collected by the server
// up to a cap and returned at once. It waits for the sandbox to run first. Exec streams
// instead and has no cap.
func (s *Sandbox) ExecUnary(ctx context.Context, argv []string, opts UnaryExecOptions) (ExecResult, error) {
	if len(argv) == 0 {
		return ExecResult{ExitCode: -1}, errors.New("sandbox: exec needs a command")
	}
	if err := s.ensureRunning(ctx); err != nil {
		return ExecResult{ExitCode: -1}, err
	}
	dc, err := s.data(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC)
	if err != nil {
		return ExecResult{ExitCode: -1}, err
	}
	res, err := dc.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: s.id, Command: argv, Env: opts.Env,
		MaxOutputBytes: opts.MaxOutputBytes, Container: s.target(opts.Container)}))
	if err != nil {
		return ExecResult{ExitCode: -1}, fromRPC(err)
	}
	m := res.Msg
	return ExecResult{Stdout: m.GetStdout(), Stderr: m.GetStderr(), ExitCode: int(m.GetExitCode()),
		StdoutTruncated: m.GetStdoutTruncated(), StderrTruncated: m.GetStderrTruncated(),
		StdoutBytes: m.GetStdoutBytesProduced(), StderrBytes: m.GetStderrBytesProduced()}, nil
}

// Run runs argv and returns its collected output and exit code.
func (s *Sandbox) Run(ctx context.Context, argv []string) (stdout, stderr []byte, code int, err error) {
	var o, e bytes.Buffer
	code, err = s.Exec(ctx, argv, ExecOptions{Stdout: &o, Stderr: &e})
	return o.Bytes(), e.Bytes(), code, err
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:@,+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}
