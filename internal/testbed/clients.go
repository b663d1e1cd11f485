package testbed

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// httpClient speaks HTTP/1.1 to the gateways: each call stands alone, so a gateway that
// is killed breaks only the calls in flight.
var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

// Sandboxes is a client of gateway i's SandboxService with the user key (Connect protocol).
func (b *Bed) Sandboxes(i int) sandboxv1connect.SandboxServiceClient {
	return sandboxv1connect.NewSandboxServiceClient(httpClient, b.GatewayURL(i), connect.WithInterceptors(connecttest.Bearer(b.UserKey)))
}

// Discovery is a client of gateway i's DiscoveryService with the user key.
func (b *Bed) Discovery(i int) sandboxv1connect.DiscoveryServiceClient {
	return sandboxv1connect.NewDiscoveryServiceClient(httpClient, b.GatewayURL(i), connect.WithInterceptors(connecttest.Bearer(b.UserKey)))
}

// purge deletes every sandbox of the user's organization through a live gateway and
// waits (up to 30 s) until none is active, so runners stop with nothing to leave behind.
func (b *Bed) purge() error {
	for i, g := range b.Gateways {
		if !g.Running() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := b.Sandboxes(i)
		var left int
		for ctx.Err() == nil {
			_, _ = c.PurgeSandboxes(ctx, connect.NewRequest(&sandboxv1.PurgeSandboxesRequest{PurgeAll: true}))
			res, err := c.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{PageSize: 1000}))
			if err == nil && len(res.Msg.GetSandboxes()) == 0 {
				return nil
			}
			if err == nil {
				left = len(res.Msg.GetSandboxes())
			}
			time.Sleep(300 * time.Millisecond)
		}
		return fmt.Errorf("purge: %d sandboxes still listed after 30 s", left)
	}
	return nil
}

// Releases is a client of the control plane's ReleaseService with the admin key.
func (b *Bed) Releases() (controlplanev1connect.ReleaseServiceClient, error) {
	hc, err := b.adminHTTP()
	if err != nil {
		return nil, err
	}
	return controlplanev1connect.NewReleaseServiceClient(hc, "https://"+b.CP.Addr, connect.WithInterceptors(connecttest.Bearer(b.AdminKey))), nil
}

// RunnerAdmin is a client of the control plane's RunnerManagementService with the admin
// key.
func (b *Bed) RunnerAdmin() (controlplanev1connect.RunnerManagementServiceClient, error) {
	admin, _, err := b.adminClients()
	return admin, err
}
