package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// LogOptions select what Logs streams.
type LogOptions struct {
	Follow     bool      // keep streaming until the main command ends (or ctx does)
	Tail       int       // only the last Tail lines (0 = all)
	Since      time.Time // only output after this time
	Timestamps bool      // prefix every line with its ISO-8601 time
	// Container is whose output to stream in a multi-container sandbox (default: the
	// handle's, see InContainer; else the primary's).
	Container string
}

// Logs writes the main command's output (stdout and stderr in the order written, not
// exec output) to w: the output of the container opts or the handle names, else the
// primary's. Without Follow it returns after what has been written so far. A followed
// stream that breaks is resumed where it stopped, up to three times. The log outlives
// the sandbox: an ended sandbox's log is there for the runner's retention window (and a
// follow ends at its end).
func (s *Sandbox) Logs(ctx context.Context, opts LogOptions, w io.Writer) error {
	if st := s.Proto().GetStatus(); st == nil || State(st.GetState()) == StateCreating || State(st.GetState()) == StatePending {
		var serr *StateError
		if err := s.Wait(ctx); err != nil && !errors.As(err, &serr) {
			return err
		}
	}
	container := s.target(opts.Container)
	req := &sandboxv1.StreamLogsRequest{SandboxId: s.id, Follow: opts.Follow, TailLines: int32(opts.Tail), Timestamps: opts.Timestamps, Container: container}
	if !opts.Since.IsZero() {
		req.SinceTime = timestamppb.New(opts.Since)
	}
	if !opts.Follow {
		var cancel context.CancelFunc
		ctx, cancel = withTimeout(ctx, defaultLogWait)
		defer cancel()
	}
	var session string
	var offset uint64
	delay := 500 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := s.streamLogs(ctx, req, w, &session, &offset)
		if err == nil || !opts.Follow || session == "" || attempt == 3 || !resumable(err) {
			return err
		}
		if serr := sleep(ctx, delay); serr != nil {
			return err
		}
		delay = min(delay*2, 4*time.Second)
		req = &sandboxv1.StreamLogsRequest{SandboxId: s.id, Follow: true, ResumeLogSessionId: session, ResumeLogOffset: offset, Container: container}
	}
}

func resumable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case connect.CodeUnavailable, connect.CodeInternal, connect.CodeUnknown:
		return e.Reason == "" || e.Reason == ReasonRunnerUnavailable
	case connect.CodeAborted:
		return e.Reason == "STREAM_INTERRUPTED"
	}
	return false
}

func (s *Sandbox) streamLogs(ctx context.Context, req *sandboxv1.StreamLogsRequest, w io.Writer, session *string, offset *uint64) error {
	dc, err := s.data(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_LOGS)
	if err != nil {
		return err
	}
	stream, err := dc.StreamLogs(ctx, connect.NewRequest(req))
	if err != nil {
		return fromRPC(err)
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
		e := stream.Msg()
		if e.GetLogSessionId() != "" {
			*session = e.GetLogSessionId()
		}
		if le := e.GetError(); le != nil {
			return &Error{Code: connect.CodeAborted, Reason: le.GetCode(), Message: "log stream: " + le.GetMessage()}
		}
		if len(e.GetData()) > 0 {
			if _, err := w.Write(e.GetData()); err != nil {
				return fmt.Errorf("sandbox: writing logs: %w", err)
			}
		}
		if e.GetNextLogOffset() > 0 {
			*offset = e.GetNextLogOffset()
		}
	}
	if err := stream.Err(); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return ctx.Err()
		}
		return fromRPC(err)
	}
	return nil
}
