package apifront

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Unknown answers a request no service takes: UNIMPLEMENTED with reason
// CWSANDBOX_NOT_IMPLEMENTED in its RPC protocol (gRPC, gRPC-Web, Connect), as a gRPC
// server answers an unknown method; a REST NOT_FOUND (AIP-193 JSON, HTTP 404) otherwise.
// Never a bare 404 that clients cannot parse.
func Unknown(w http.ResponseWriter, r *http.Request) {
	if isRPC(r) {
		path := textclip.Clip(r.URL.Path, 128)
		_ = errWriter.Write(w, r, apierr.New(apierr.NotImplemented,
			"this server has no procedure "+path, map[string]string{"procedure": path}))
		return
	}
	WriteRESTError(w, errNoRoute(r))
}

// errNoRoute: no REST route has r's path.
func errNoRoute(r *http.Request) error {
	path := textclip.Clip(r.URL.Path, 128)
	return apierr.New(apierr.RouteNotFound,
		fmt.Sprintf("no route %s %s: GET /openapi.json lists the REST routes", textclip.Clip(r.Method, 128), path),
		map[string]string{"method": textclip.Clip(r.Method, 128), "path": path})
}

var errWriter = connect.NewErrorWriter()

// isRPC: r is a gRPC, gRPC-Web or Connect call (paths under /v1/ are REST's). A GET is
// Connect only when it says so; errWriter takes every GET for Connect.
func isRPC(r *http.Request) bool {
	switch {
	case isREST(r):
		return false
	case r.Method == http.MethodGet:
		return r.Header.Get("Connect-Protocol-Version") != "" || r.URL.Query().Get("connect") == "v1"
	}
	return errWriter.IsSupported(r)
}

// NotImplemented is a connect interceptor that gives an UNIMPLEMENTED error without an
// ErrorInfo of ours (what the generated Unimplemented…Handler stubs return) the reason
// CWSANDBOX_NOT_IMPLEMENTED, on every protocol. A service answers UNIMPLEMENTED for an
// RPC sandboxd does not build yet by embedding its generated stub: building the RPC is
// defining its method, nothing else.
type NotImplemented struct{}

func notImplemented(procedure string, err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnimplemented || apierr.Info(err) != nil {
		return err
	}
	return apierr.New(apierr.NotImplemented,
		procedure+" is not implemented by this sandboxd yet", map[string]string{"procedure": procedure})
}

func (NotImplemented) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, notImplemented(req.Spec().Procedure, err)
	}
}

func (NotImplemented) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (NotImplemented) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return notImplemented(conn.Spec().Procedure, next(ctx, conn))
	}
}
