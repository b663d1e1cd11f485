// Package gatewaytest has stand-ins for tests outside internal/gateway that need a
// gateway (its API port, authentication, routing, errors) but no sandboxes. (The
// gateway's own tests cannot import it: it imports the gateway.)
package gatewaytest

import (
	"context"
	"errors"
	"time"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// IdleRunner is a runner.Handle without sandboxes that creates none: a create is an
// error, every other call about a sandbox runtime.ErrNotFound, and Capacity reports Cap.
type IdleRunner struct {
	RunnerID, GroupID string
	Cap               runner.Capacity
}

var _ runner.Handle = IdleRunner{}

func (r IdleRunner) ID() string    { return r.RunnerID }
func (r IdleRunner) Group() string { return r.GroupID }
func (IdleRunner) Create(context.Context, runner.CreateRequest) (runner.Sandbox, error) {
	return runner.Sandbox{}, errors.New("an idle runner creates no sandbox")
}
func (IdleRunner) Get(context.Context, string) (runner.Sandbox, error) {
	return runner.Sandbox{}, runtime.ErrNotFound
}
func (IdleRunner) Delete(context.Context, string, time.Duration) (runner.Sandbox, error) {
	return runner.Sandbox{}, runtime.ErrNotFound
}
func (IdleRunner) Agent(context.Context, string, string) (agentv1connect.AgentServiceClient, error) {
	return nil, runtime.ErrNotFound
}
func (IdleRunner) Logs(context.Context, string, string, *agentv1.LogsRequest, func(*agentv1.LogsResponse) error) error {
	return runtime.ErrNotFound
}
func (r IdleRunner) Capacity(context.Context) (runner.Capacity, error) { return r.Cap, nil }
