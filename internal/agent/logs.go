package agent

import (
	"context"
	"errors"
	"io/fs"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
)

// ReadLogs answers a Logs request from the main command's log in dir: the one reader of
// logs, used by the agent for a live log (w its writer, so a follow goes on until w
// closes) and by the runner for the copy it keeps after the sandbox ended (w nil: the
// log is complete, and a follow ends at its end). A log that was never written is empty.
// Errors are connect errors; an error from send is returned as it is.
func ReadLogs(ctx context.Context, dir string, w *logstore.Writer, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	return ReadLogsFrom(ctx, func() (*logstore.Reader, error) { return logstore.OpenReader(dir, agentconfig.MainLog) }, w, req, send)
}

// ReadLogsFrom is ReadLogs of the log that open opens (e.g. logstore.OpenReaderBeneath,
// for a log below a directory its sandbox can write).
func ReadLogsFrom(ctx context.Context, open func() (*logstore.Reader, error), w *logstore.Writer, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	if req.GetTailLines() < 0 {
		return invalidArg("tail_lines must not be negative")
	}
	opts := logstore.ReadOptions{TailLines: int(req.GetTailLines()), Offset: req.GetOffset(), FromOffset: req.GetFromOffset()}
	if req.GetSince() != nil {
		opts.Since = req.GetSince().AsTime()
	}
	r, err := open()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	defer func() { _ = r.Close() }()
	var sendErr error
	pass := func(c logstore.Chunk) error {
		sendErr = send(&agentv1.LogsResponse{
			Data: c.Data, Time: timestamppb.New(c.Time), Stream: agentv1.Stream(c.Stream),
			Offset: c.Offset, NextOffset: c.NextOffset(),
		})
		return sendErr
	}
	if req.GetFollow() {
		err = logstore.Follow(ctx, r, w, opts, pass)
	} else {
		_, err = r.Read(opts, pass)
	}
	switch {
	case err == nil:
		return nil
	case sendErr != nil:
		return sendErr
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeCanceled, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// ForwardLogs calls Logs on c and passes every message to send. An error from send is
// returned as it is.
func ForwardLogs(ctx context.Context, c agentv1connect.AgentServiceClient, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	stream, err := c.Logs(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
		if err := send(stream.Msg()); err != nil {
			return err
		}
	}
	return stream.Err()
}
