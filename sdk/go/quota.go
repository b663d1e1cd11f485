package sandbox

import (
	"context"

	"connectrpc.com/connect"

	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
)

// QuotaUsage returns what counts against the caller's organization's quota (its live
// sandboxes and creates in flight) and its effective limits (sandboxd.quota.v1; an
// absent limit is unlimited). A create past a limit fails with an *Error of reason
// CWSANDBOX_QUOTA_EXCEEDED (RESOURCE_EXHAUSTED) whose metadata names quota, limit,
// current and requested.
func (c *Client) QuotaUsage(ctx context.Context) (*quotav1.QuotaUsage, error) {
	res, err := c.quota.GetQuotaUsage(ctx, connect.NewRequest(&quotav1.GetQuotaUsageRequest{}))
	if err != nil {
		return nil, fromRPC(err)
	}
	return res.Msg, nil
}
