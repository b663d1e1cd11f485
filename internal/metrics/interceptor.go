package metrics

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// Services the API interceptor records: the public API (gateway) and the runner's direct
// data plane (the same data calls).
const (
	svcSandbox   = "/coreweave.sandbox.v1.SandboxService/"
	svcDataPlane = "/coreweave.sandbox.v1.SandboxDataPlaneService/"
)

// streamKinds are the streaming procedures cwsandbox_streams counts, by method name.
var streamKinds = map[string]string{
	"StreamExec":          StreamExec,
	"StreamLogs":          StreamLogs,
	"ConnectSandbox":      StreamConnect,
	"GetSandboxBuildLogs": StreamBuildLogs,
}

// Interceptor records the API calls it sees under path (PathGateway or PathDirect):
// creates and deletes by result and reason, exec latency, file reads and writes (latency
// and bytes) and open streams. It adds no labels from requests. While recording is off
// (counters.SetRecording) it passes calls through untouched.
func (m *Metrics) Interceptor(path string) connect.Interceptor {
	if path != PathDirect {
		path = PathGateway
	}
	return interceptor{m: m, path: path}
}

type interceptor struct {
	m    *Metrics
	path string
}

// method is proc's method name when proc is one of the recorded services', else "".
func method(proc string) string {
	for _, svc := range []string{svcSandbox, svcDataPlane} {
		if m, ok := strings.CutPrefix(proc, svc); ok {
			return m
		}
	}
	return ""
}

type contentHolder interface{ GetContent() []byte }

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		meth := method(req.Spec().Procedure)
		if meth == "" || req.Spec().IsClient || !counters.Recording() {
			return next(ctx, req)
		}
		start := time.Now()
		resp, err := next(ctx, req)
		switch {
		case meth == "CreateSandbox" && strings.HasPrefix(req.Spec().Procedure, svcSandbox):
			i.m.ObserveCreate(err)
		case meth == "DeleteSandbox" && strings.HasPrefix(req.Spec().Procedure, svcSandbox):
			i.m.ObserveDelete(err)
		case meth == "Exec":
			i.m.ObserveExec(i.path, time.Since(start), err)
			if r, ok := req.Any().(interface{ GetSandboxId() string }); ok {
				i.m.Executed(r.GetSandboxId(), err)
			}
		case meth == "ReadFile":
			var n int
			if err == nil && resp != nil {
				if c, ok := resp.Any().(contentHolder); ok {
					n = len(c.GetContent())
				}
			}
			i.m.ObserveFile(OpRead, i.path, time.Since(start), n, err)
		case meth == "WriteFile":
			var n int
			if err == nil {
				if c, ok := req.Any().(contentHolder); ok {
					n = len(c.GetContent())
				}
			}
			i.m.ObserveFile(OpWrite, i.path, time.Since(start), n, err)
		}
		return resp, err
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		kind, ok := streamKinds[method(conn.Spec().Procedure)]
		if !ok || !counters.Recording() {
			return next(ctx, conn)
		}
		g := i.m.streams.WithLabelValues(kind, i.path)
		g.Inc()
		defer g.Dec()
		return next(ctx, conn)
	}
}
