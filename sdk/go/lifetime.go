package sandbox

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
)

// Lifetime is a sandbox's lifetime after a change: Max counts from its creation and ends
// at Deadline.
type Lifetime struct {
	Max      time.Duration
	Deadline time.Time
}

// SetLifetime makes the running sandbox id's total lifetime (counted from its creation)
// total, in whole seconds, within the runner policy's maximum
// (sandboxd.sandbox.v1.SandboxStateService, sandboxd's own API beside the wire
// protocol). A total already over stops the sandbox as its lifetime's end does.
func (c *Client) SetLifetime(ctx context.Context, id string, total time.Duration) (Lifetime, error) {
	if total%time.Second != 0 {
		return Lifetime{}, fmt.Errorf("a lifetime is whole seconds, got %s", total)
	}
	return c.updateLifetime(ctx, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id,
		Change: &statev1.UpdateSandboxLifetimeRequest_MaxLifetimeSeconds{MaxLifetimeSeconds: int64(total / time.Second)}})
}

// ExtendLifetime adds by (whole seconds; negative shortens) to the running sandbox id's
// lifetime, as SetLifetime.
func (c *Client) ExtendLifetime(ctx context.Context, id string, by time.Duration) (Lifetime, error) {
	if by%time.Second != 0 {
		return Lifetime{}, fmt.Errorf("a lifetime change is whole seconds, got %s", by)
	}
	return c.updateLifetime(ctx, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id,
		Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: int64(by / time.Second)}})
}

func (c *Client) updateLifetime(ctx context.Context, req *statev1.UpdateSandboxLifetimeRequest) (Lifetime, error) {
	cctx, cancel := withTimeout(ctx, getTimeout)
	defer cancel()
	res, err := c.state.UpdateSandboxLifetime(cctx, connect.NewRequest(req))
	if err != nil {
		return Lifetime{}, fromRPC(err)
	}
	return Lifetime{Max: time.Duration(res.Msg.GetMaxLifetimeSeconds()) * time.Second, Deadline: res.Msg.GetDeadline().AsTime()}, nil
}
