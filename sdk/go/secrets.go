package sandbox

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
)

// Secret stores (docs/secrets.md): an organization's built-in stores
// (coreweave.sandbox.v1.SettingsService) and their write-only secrets
// (sandboxd.settings.v1.SecretService). Containers reference secrets with
// Container.secret_stores (environment variables) and image_pull_credentials.

// CreateSecretStore creates a built-in secret store named name (SANDBOX_ADMIN);
// requestID (optional) makes a retried create return the same store.
func (c *Client) CreateSecretStore(ctx context.Context, name, requestID string) (*sandboxv1.SecretStore, error) {
	return c.CreateSecretStoreOf(ctx, name, sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_SANDBOXD, requestID)
}

// CreateSecretStoreOf creates a secret store of provider (SANDBOXD, the built-in store, or
// KUBERNETES: Secrets in a Kubernetes runner's namespace that grant the store, docs/secrets.md).
func (c *Client) CreateSecretStoreOf(ctx context.Context, name string, provider sandboxv1.SecretStoreProviderType, requestID string) (*sandboxv1.SecretStore, error) {
	res, err := c.setting.CreateSecretStore(ctx, connect.NewRequest(&sandboxv1.CreateSecretStoreRequest{
		SecretStore: &sandboxv1.SecretStore{Name: name, ProviderType: provider},
		RequestId:   requestID}))
	if err != nil {
		return nil, fromRPC(err)
	}
	return res.Msg, nil
}

// ListSecretStores returns every secret store of the caller's organization.
func (c *Client) ListSecretStores(ctx context.Context) ([]*sandboxv1.SecretStore, error) {
	var out []*sandboxv1.SecretStore
	token := ""
	for range maxListPages {
		res, err := c.setting.ListSecretStores(ctx, connect.NewRequest(&sandboxv1.ListSecretStoresRequest{PageToken: token}))
		if err != nil {
			return nil, fromRPC(err)
		}
		out = append(out, res.Msg.GetSecretStores()...)
		if token = res.Msg.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
	return out, errors.New("sandbox: too many pages of secret stores")
}

// DeleteSecretStore deletes a store and its secrets (SANDBOX_ADMIN).
func (c *Client) DeleteSecretStore(ctx context.Context, name string, allowMissing bool) error {
	_, err := c.setting.DeleteSecretStore(ctx, connect.NewRequest(&sandboxv1.DeleteSecretStoreRequest{Name: name, AllowMissing: allowMissing}))
	return fromRPC(err)
}

// PutSecret sets a secret's value (SANDBOX_ADMIN). The value is never returned by any
// call.
func (c *Client) PutSecret(ctx context.Context, store, path, field, value string) (*settingsv1.Secret, error) {
	res, err := c.secret.PutSecret(ctx, connect.NewRequest(&settingsv1.PutSecretRequest{StoreName: store, Path: path, Field: field, Value: value}))
	if err != nil {
		return nil, fromRPC(err)
	}
	return res.Msg, nil
}

// ListSecrets returns a store's secrets: paths, fields and times, never values.
func (c *Client) ListSecrets(ctx context.Context, store string) ([]*settingsv1.Secret, error) {
	var out []*settingsv1.Secret
	token := ""
	for range maxListPages {
		res, err := c.secret.ListSecrets(ctx, connect.NewRequest(&settingsv1.ListSecretsRequest{StoreName: store, PageToken: token}))
		if err != nil {
			return nil, fromRPC(err)
		}
		out = append(out, res.Msg.GetSecrets()...)
		if token = res.Msg.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
	return out, errors.New("sandbox: too many pages of secrets")
}

// DeleteSecret deletes one secret (SANDBOX_ADMIN).
func (c *Client) DeleteSecret(ctx context.Context, store, path, field string, allowMissing bool) error {
	_, err := c.secret.DeleteSecret(ctx, connect.NewRequest(&settingsv1.DeleteSecretRequest{StoreName: store, Path: path, Field: field, AllowMissing: allowMissing}))
	return fromRPC(err)
}
