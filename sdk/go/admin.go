package sandbox

import (
	"context"
	"os"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1/auditv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1/quotav1connect"
)

// Admin is a client for sandboxd's control plane (sandboxd.controlplane.v1): managed
// runners with their policies, API keys and runner releases. It needs an API key with role SANDBOX_ADMIN.
// Errors are *Error, like the sandbox client's.
//
//	adm, err := sandbox.NewAdmin("", "") // CWSANDBOX_BASE_URL, CWSANDBOX_API_KEY
//	r, err := adm.Runners.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "local"}))
type Admin struct {
	Runners  controlplanev1connect.RunnerManagementServiceClient
	APIKeys  controlplanev1connect.ApiKeyServiceClient
	Releases controlplanev1connect.ReleaseServiceClient
	// Rollouts controls the automatic rollout (resuming a halted channel).
	Rollouts controlplanev1connect.RolloutServiceClient
	// Clusters needs a key of the platform organization.
	Clusters controlplanev1connect.ClusterServiceClient
	// Quotas are the organizations' quotas (sandboxd.quota.v1, served by the gateway):
	// SetQuota needs an admin key of the platform organization; GetQuota and
	// GetQuotaUsage read the key's own organization (the platform's admins: any).
	Quotas quotav1connect.QuotaServiceClient
	// Audit reads the audit log (sandboxd.audit.v1, served by the gateway): an admin
	// key reads its organization's events; the platform organization's admins any.
	Audit auditv1connect.AuditServiceClient
	// Discovery lists the runners the gateway places on, with their health as the key's
	// organization sees it (the tags sandboxd.health= and sandboxd.health.reason=).
	Discovery sandboxv1connect.DiscoveryServiceClient
}

// NewAdmin returns an admin client for baseURL with apiKey; empty arguments default to
// the environment as in New.
func NewAdmin(baseURL, apiKey string, opts ...Option) (*Admin, error) {
	c, err := New(baseURL, apiKey, opts...)
	if err != nil {
		return nil, err
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if apiKey == "" {
		apiKey = os.Getenv(EnvAPIKey)
	}
	copts := []connect.ClientOption{
		connect.WithGRPC(),
		connect.WithInterceptors(headers{key: apiKey, ua: cfg.userAgent}, asError{}),
	}
	return &Admin{
		Runners:   controlplanev1connect.NewRunnerManagementServiceClient(c.http, c.baseURL, copts...),
		APIKeys:   controlplanev1connect.NewApiKeyServiceClient(c.http, c.baseURL, copts...),
		Releases:  controlplanev1connect.NewReleaseServiceClient(c.http, c.baseURL, copts...),
		Rollouts:  controlplanev1connect.NewRolloutServiceClient(c.http, c.baseURL, copts...),
		Clusters:  controlplanev1connect.NewClusterServiceClient(c.http, c.baseURL, copts...),
		Quotas:    quotav1connect.NewQuotaServiceClient(c.http, c.baseURL, copts...),
		Audit:     auditv1connect.NewAuditServiceClient(c.http, c.baseURL, copts...),
		Discovery: sandboxv1connect.NewDiscoveryServiceClient(c.http, c.baseURL, copts...),
	}, nil
}

// maxAdminPages bounds a listing of runners or keys.
const maxAdminPages = 100

// ListRunners returns every managed runner, following page tokens.
func (a *Admin) ListRunners(ctx context.Context) ([]*controlplanev1.ManagedRunner, error) {
	return collectPages(ctx, maxAdminPages, func(ctx context.Context, token string) ([]*controlplanev1.ManagedRunner, string, error) {
		out, err := a.Runners.ListManagedRunners(ctx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{PageToken: token}))
		if err != nil {
			return nil, "", err
		}
		return out.Msg.GetManagedRunners(), out.Msg.GetNextPageToken(), nil
	})
}

// ListAPIKeys returns every API key of the caller's organization, revoked ones too.
func (a *Admin) ListAPIKeys(ctx context.Context) ([]*controlplanev1.ApiKey, error) {
	return collectPages(ctx, maxAdminPages, func(ctx context.Context, token string) ([]*controlplanev1.ApiKey, string, error) {
		out, err := a.APIKeys.ListApiKeys(ctx, connect.NewRequest(&controlplanev1.ListApiKeysRequest{PageToken: token}))
		if err != nil {
			return nil, "", err
		}
		return out.Msg.GetApiKeys(), out.Msg.GetNextPageToken(), nil
	})
}

// asError turns RPC errors into *Error.
type asError struct{}

func (asError) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, fromRPC(err)
	}
}

func (asError) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (asError) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
