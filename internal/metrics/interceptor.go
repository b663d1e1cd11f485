package metrics

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Procedures the API interceptor records (suffixes of the full procedure name).
const (
	procCreate = "/coreweave.sandbox.v1.SandboxService/CreateSandbox"
	procDelete = "/coreweave.sandbox.v1.SandboxService/DeleteSandbox"
	procExec   = "/coreweave.sandbox.v1.SandboxService/Exec"
)

// Interceptor records the API calls it sees (creates and deletes by result and reason,
// exec latency) under path (PathGateway or PathDirect). It adds no labels from requests.
func (m *Metrics) Interceptor(path string) connect.Interceptor { return interceptor{m: m, path: path} }

type interceptor struct {
	m    *Metrics
	path string
}

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		proc := req.Spec().Procedure
		if !strings.HasPrefix(proc, "/coreweave.sandbox.v1.SandboxService/") || req.Spec().IsClient {
			return next(ctx, req)
		}
		start := time.Now()
		resp, err := next(ctx, req)
		switch proc {
		case procCreate:
			i.m.ObserveCreate(err)
		case procDelete:
			i.m.ObserveDelete(err)
		case procExec:
			i.m.ObserveExec(i.path, time.Since(start), err)
		}
		return resp, err
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
