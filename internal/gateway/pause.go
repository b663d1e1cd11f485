package gateway

import (
	"context"

	"connectrpc.com/connect"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// PauseSandbox implements sandboxd.sandbox.v1.SandboxStateService (not built yet).
func (s *Server) PauseSandbox(ctx context.Context, req *connect.Request[statev1.PauseSandboxRequest]) (*connect.Response[statev1.PauseSandboxResponse], error) {
	return nil, apierr.Newf(apierr.NotImplemented, "PauseSandbox is not built yet")
}

// ResumeSandbox implements sandboxd.sandbox.v1.SandboxStateService (not built yet).
func (s *Server) ResumeSandbox(ctx context.Context, req *connect.Request[statev1.ResumeSandboxRequest]) (*connect.Response[statev1.ResumeSandboxResponse], error) {
	return nil, apierr.Newf(apierr.NotImplemented, "ResumeSandbox is not built yet")
}

// ForkSandbox implements sandboxd.sandbox.v1.SandboxStateService (not built yet).
func (s *Server) ForkSandbox(ctx context.Context, req *connect.Request[statev1.ForkSandboxRequest]) (*connect.Response[statev1.ForkSandboxResponse], error) {
	return nil, apierr.Newf(apierr.NotImplemented, "ForkSandbox is not built yet")
}
