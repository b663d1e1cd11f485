package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Secret stores (issue 23 point 2; docs/secrets.md): SettingsService's
// Create/Get/List/Update/DeleteSecretStore for the built-in provider, and
// sandboxd.settings.v1.SecretService for the secrets' values, which are write-only:
// sealed here (AES-256-GCM, internal/secretbox) before the store sees them, opened only by
// CreateSandbox's resolver, and never returned by any RPC.

// SecretOptions configures secret stores. Without Store and Keys every secret store RPC
// is UNIMPLEMENTED and containers' secret references are refused as not implemented.
type SecretOptions struct {
	Store store.SecretStores
	Keys  *secretbox.Keyring
	// Bounds (0: the defaults below).
	MaxStores, MaxSecretsPerStore, MaxValueBytes int
}

// Default bounds of the built-in secret stores.
const (
	DefaultMaxSecretStores    = 100
	DefaultMaxSecretsPerStore = 1000
	DefaultMaxSecretValue     = 64 << 10
	// maxResolvedSecretBytes bounds the values one create resolves (all containers).
	maxResolvedSecretBytes = 1 << 20
)

func (o SecretOptions) withDefaults() SecretOptions {
	if o.MaxStores <= 0 {
		o.MaxStores = DefaultMaxSecretStores
	}
	if o.MaxSecretsPerStore <= 0 {
		o.MaxSecretsPerStore = DefaultMaxSecretsPerStore
	}
	if o.MaxValueBytes <= 0 {
		o.MaxValueBytes = DefaultMaxSecretValue
	}
	return o
}

func (o SecretOptions) enabled() bool { return o.Store != nil && o.Keys != nil }

var errSecretsOff = apierr.Newf(apierr.NotImplemented, "secret stores need a store and a secret key file (this gateway has none)")

func secretsUnavailable(what string, err error) error {
	return apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "%s cannot be read or written now: %v", what, err), 5*time.Second)
}

func secretStoreNotFound(name string) error {
	return apierr.New(apierr.SecretStoreNotFound, fmt.Sprintf("secret store %q not found", name), map[string]string{"store_name": name})
}

func invalidField(field, desc string) error {
	vs := []apierr.Violation{{Field: field, Description: desc}}
	return apierr.Invalid(apierr.InvalidRequest, apierr.Describe(vs), vs)
}

// builtinProvider reports whether t is the built-in provider, or the error refusing it.
func builtinProvider(field string, t sandboxv1.SecretStoreProviderType) error {
	switch t {
	case sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_UNSPECIFIED, sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_SANDBOXD,
		sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_KUBERNETES:
		return nil
	case sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_WANDB:
		vs := []apierr.Violation{{Field: field, Description: "WANDB secret stores are not built by sandboxd; use SECRET_STORE_PROVIDER_TYPE_UNSPECIFIED or SECRET_STORE_PROVIDER_TYPE_SANDBOXD (the built-in store)"}}
		return apierr.WithViolations(apierr.New(apierr.SecretStoreProviderUnsupported, "secret store provider WANDB is not supported: "+apierr.Describe(vs), nil), vs)
	}
	return invalidField(field, fmt.Sprintf("%d is not a SecretStoreProviderType", int32(t)))
}

func secretStoreProto(st store.SecretStore) *sandboxv1.SecretStore {
	return &sandboxv1.SecretStore{Name: st.Name, ProviderType: sandboxv1.SecretStoreProviderType(st.ProviderType),
		CreateTime: timestamppb.New(st.CreateTime), UpdateTime: timestamppb.New(st.UpdateTime)}
}

// checkSecretStoreBody checks a SecretStore of a create or update (at field f).
func checkSecretStoreBody(f string, in *sandboxv1.SecretStore) error {
	if d := spec.SecretStoreNameViolation(in.GetName()); d != "" {
		return invalidField(f+".name", d)
	}
	if err := builtinProvider(f+".provider_type", in.GetProviderType()); err != nil {
		return err
	}
	if in.GetWandb() != nil {
		return invalidField(f+".wandb", "is the WANDB provider's configuration; the built-in store has none")
	}
	return nil
}

// CreateSecretStore registers a built-in secret store of the caller's organization
// (SANDBOX_ADMIN). A repeated request_id returns the store it created (or
// CWSANDBOX_REQUEST_ID_CONFLICT for another store); a taken name is ALREADY_EXISTS.
func (s *Server) CreateSecretStore(ctx context.Context, req *connect.Request[sandboxv1.CreateSecretStoreRequest]) (*connect.Response[sandboxv1.SecretStore], error) {
	if err := requireAdmin(ctx, "CreateSecretStore"); err != nil {
		return nil, err
	}
	if !s.secrets.enabled() {
		return nil, errSecretsOff
	}
	org, in, rid := principal(ctx).Org, req.Msg.GetSecretStore(), req.Msg.GetRequestId()
	if in == nil {
		return nil, invalidField("secret_store", "is required")
	}
	if vs := requestIDViolations("request_id", rid); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid request_id: "+apierr.Describe(vs), vs)
	}
	if err := checkSecretStoreBody("secret_store", in); err != nil {
		return nil, err
	}
	ss := s.secrets.Store
	// replay answers a repeated request_id (done: there was one).
	replay := func() (resp *connect.Response[sandboxv1.SecretStore], done bool, err error) {
		got, err := ss.GetByRequestID(ctx, org, rid)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil, false, nil
		case err != nil:
			return nil, true, secretsUnavailable("the secret stores", err)
		case got.Name != in.GetName() || got.ProviderType != int32(in.GetProviderType()):
			vs := []apierr.Violation{{Field: "request_id", Description: fmt.Sprintf("already created secret store %q from a different request", got.Name)}}
			return nil, true, apierr.Invalid(apierr.RequestIDConflict, "request_id conflict: "+apierr.Describe(vs), vs)
		}
		return connect.NewResponse(secretStoreProto(got)), true, nil
	}
	if rid != "" {
		if resp, done, err := replay(); done {
			return resp, err
		}
	}
	st, err := ss.Create(ctx, store.SecretStore{Org: org, Name: in.GetName(), ProviderType: int32(in.GetProviderType()), RequestID: rid}, s.secrets.MaxStores)
	var dup *store.AlreadyExistsError
	switch {
	case errors.Is(err, store.ErrLimitExceeded):
		return nil, apierr.New(apierr.SecretLimitExceeded, fmt.Sprintf("the organization has %d secret stores, the most it may have; delete one first", s.secrets.MaxStores),
			map[string]string{"limit": fmt.Sprint(s.secrets.MaxStores)})
	case errors.As(err, &dup) && dup.Key == store.KeyRequestID:
		if resp, done, err := replay(); done {
			return resp, err
		}
		return nil, secretsUnavailable("the secret stores", err)
	case errors.As(err, &dup):
		return nil, apierr.New(apierr.AlreadyExists, fmt.Sprintf("secret store %q already exists", in.GetName()), map[string]string{"store_name": in.GetName()})
	case err != nil:
		return nil, secretsUnavailable("the secret stores", err)
	}
	s.log.Info("secret store created", "org", org, "store", st.Name)
	return connect.NewResponse(secretStoreProto(st)), nil
}

// getStore is the caller's store name (NOT_FOUND when it has none).
func (s *Server) getStore(ctx context.Context, field, name string) (store.SecretStore, error) {
	if !s.secrets.enabled() {
		return store.SecretStore{}, errSecretsOff
	}
	if d := spec.SecretStoreNameViolation(name); d != "" {
		return store.SecretStore{}, invalidField(field, d)
	}
	st, err := s.secrets.Store.Get(ctx, principal(ctx).Org, name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.SecretStore{}, secretStoreNotFound(name)
	case err != nil:
		return store.SecretStore{}, secretsUnavailable("the secret stores", err)
	}
	return st, nil
}

// GetSecretStore returns one store of the caller's organization.
func (s *Server) GetSecretStore(ctx context.Context, req *connect.Request[sandboxv1.GetSecretStoreRequest]) (*connect.Response[sandboxv1.SecretStore], error) {
	st, err := s.getStore(ctx, "name", req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(secretStoreProto(st)), nil
}

// ListSecretStores pages through the caller's organization's stores by name.
func (s *Server) ListSecretStores(ctx context.Context, req *connect.Request[sandboxv1.ListSecretStoresRequest]) (*connect.Response[sandboxv1.ListSecretStoresResponse], error) {
	if !s.secrets.enabled() {
		return nil, errSecretsOff
	}
	size, err := apierr.PageSize(req.Msg.GetPageSize(), defaultPageSize, maxPageSize)
	if err != nil {
		return nil, err
	}
	sts, next, err := s.secrets.Store.List(ctx, principal(ctx).Org, store.Page{Size: size, Token: req.Msg.GetPageToken()})
	switch {
	case errors.Is(err, store.ErrInvalid):
		return nil, invalidField("page_token", "is not a token this server issued")
	case err != nil:
		return nil, secretsUnavailable("the secret stores", err)
	}
	out := &sandboxv1.ListSecretStoresResponse{NextPageToken: next}
	for _, st := range sts {
		out.SecretStores = append(out.SecretStores, secretStoreProto(st))
	}
	return connect.NewResponse(out), nil
}

// UpdateSecretStore changes what update_mask names (SANDBOX_ADMIN): of the built-in
// store only provider_type, between UNSPECIFIED and SANDBOXD (the name is the key).
func (s *Server) UpdateSecretStore(ctx context.Context, req *connect.Request[sandboxv1.UpdateSecretStoreRequest]) (*connect.Response[sandboxv1.SecretStore], error) {
	if err := requireAdmin(ctx, "UpdateSecretStore"); err != nil {
		return nil, err
	}
	in := req.Msg.GetSecretStore()
	if in == nil {
		return nil, invalidField("secret_store", "is required")
	}
	cur, err := s.getStore(ctx, "secret_store.name", in.GetName())
	if err != nil {
		return nil, err
	}
	setProvider := len(req.Msg.GetUpdateMask().GetPaths()) == 0
	for _, p := range req.Msg.GetUpdateMask().GetPaths() {
		switch p {
		case "provider_type", "*":
			setProvider = true
		case "name", "create_time", "update_time":
			return nil, invalidField("update_mask", fmt.Sprintf("%q cannot be changed (the name is the store's key; times are output only)", p))
		case "wandb":
			return nil, invalidField("update_mask", `"wandb" is the WANDB provider's configuration; the built-in store has none`)
		default:
			return nil, invalidField("update_mask", fmt.Sprintf("%q is not a field of SecretStore (provider_type)", textclip.Clip(p, 64)))
		}
	}
	if err := checkSecretStoreBody("secret_store", in); err != nil {
		return nil, err
	}
	pt := cur.ProviderType
	if setProvider {
		pt = int32(in.GetProviderType())
	}
	st, err := s.secrets.Store.Touch(ctx, cur.Org, cur.Name, pt)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, secretStoreNotFound(cur.Name)
	case err != nil:
		return nil, secretsUnavailable("the secret stores", err)
	}
	return connect.NewResponse(secretStoreProto(st)), nil
}

// DeleteSecretStore removes a store and its secrets (SANDBOX_ADMIN). Sandboxes already
// created keep the values they were given.
func (s *Server) DeleteSecretStore(ctx context.Context, req *connect.Request[sandboxv1.DeleteSecretStoreRequest]) (*connect.Response[emptypb.Empty], error) {
	if err := requireAdmin(ctx, "DeleteSecretStore"); err != nil {
		return nil, err
	}
	if _, err := s.getStore(ctx, "name", req.Msg.GetName()); err != nil {
		if req.Msg.GetAllowMissing() && apierr.Reason(err) == apierr.SecretStoreNotFound {
			return connect.NewResponse(&emptypb.Empty{}), nil
		}
		return nil, err
	}
	org := principal(ctx).Org
	err := s.secrets.Store.Delete(ctx, org, req.Msg.GetName())
	switch {
	case errors.Is(err, store.ErrNotFound):
		if !req.Msg.GetAllowMissing() {
			return nil, secretStoreNotFound(req.Msg.GetName())
		}
	case err != nil:
		return nil, secretsUnavailable("the secret stores", err)
	}
	s.log.Info("secret store deleted", "org", org, "store", req.Msg.GetName())
	return connect.NewResponse(&emptypb.Empty{}), nil
}

// secretService serves sandboxd.settings.v1.SecretService.
type secretService struct{ s *Server }

func secretProto(x store.Secret) *settingsv1.Secret {
	return &settingsv1.Secret{StoreName: x.Store, Path: x.Path, Field: x.Field,
		CreateTime: timestamppb.New(x.CreateTime), UpdateTime: timestamppb.New(x.UpdateTime)}
}

// checkSecretAddress checks a request's path and field.
func checkSecretAddress(path, field string) error {
	if d := spec.SecretPathViolation(path); d != "" {
		return invalidField("path", d)
	}
	if d := spec.SecretFieldViolation(field); d != "" {
		return invalidField("field", d)
	}
	return nil
}

// PutSecret seals the value and stores it (SANDBOX_ADMIN). Errors never quote the value.
func (x secretService) PutSecret(ctx context.Context, req *connect.Request[settingsv1.PutSecretRequest]) (*connect.Response[settingsv1.Secret], error) {
	s, m := x.s, req.Msg
	if err := requireAdmin(ctx, "PutSecret"); err != nil {
		return nil, err
	}
	if !s.secrets.enabled() {
		return nil, errSecretsOff
	}
	if d := spec.SecretStoreNameViolation(m.GetStoreName()); d != "" {
		return nil, invalidField("store_name", d)
	}
	if err := checkSecretAddress(m.GetPath(), m.GetField()); err != nil {
		return nil, err
	}
	v := m.GetValue()
	switch {
	case len(v) > s.secrets.MaxValueBytes:
		return nil, invalidField("value", fmt.Sprintf("is %d bytes, at most %d allowed", len(v), s.secrets.MaxValueBytes))
	case strings.IndexByte(v, 0) >= 0:
		return nil, invalidField("value", "must not contain NUL bytes (it becomes an environment variable)")
	case !utf8.ValidString(v):
		return nil, invalidField("value", "must be UTF-8")
	}
	org := principal(ctx).Org
	if st, err := s.secrets.Store.Get(ctx, org, m.GetStoreName()); err == nil && kubernetesStore(st.ProviderType) {
		vs := []apierr.Violation{{Field: "store_name", Description: fmt.Sprintf("secret store %q is a KUBERNETES store: its values are Kubernetes Secrets in the runner's namespace, made there (docs/secrets.md), never sent to sandboxd", m.GetStoreName())}}
		return nil, apierr.WithViolations(apierr.New(apierr.SecretStoreProviderUnsupported, apierr.Describe(vs), map[string]string{"store_name": m.GetStoreName()}), vs)
	}
	ad := secretbox.AD(org, m.GetStoreName(), m.GetPath(), m.GetField())
	kid, ct := s.secrets.Keys.Seal([]byte(v), ad)
	out, err := s.secrets.Store.PutSecret(ctx, store.Secret{Org: org, Store: m.GetStoreName(), Path: m.GetPath(), Field: m.GetField(), KeyID: kid, Ciphertext: ct},
		s.secrets.MaxSecretsPerStore)
	if errors.Is(err, store.ErrKeyRetired) {
		// Sealed under a key `secret-key prune` retired: this ring is older than the key
		// file. Read the file now and seal under its current key (once).
		s.secrets.Keys.Reload()
		kid, ct = s.secrets.Keys.Seal([]byte(v), ad)
		out, err = s.secrets.Store.PutSecret(ctx, store.Secret{Org: org, Store: m.GetStoreName(), Path: m.GetPath(), Field: m.GetField(), KeyID: kid, Ciphertext: ct},
			s.secrets.MaxSecretsPerStore)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		vs := []apierr.Violation{{Field: "store_name", Description: fmt.Sprintf("secret store %q is not provisioned in this organization; create it first (CreateSecretStore)", m.GetStoreName())}}
		return nil, apierr.WithViolations(apierr.New(apierr.SecretStoreNotProvisioned, apierr.Describe(vs), map[string]string{"store_name": m.GetStoreName()}), vs)
	case errors.Is(err, store.ErrLimitExceeded):
		return nil, apierr.New(apierr.SecretLimitExceeded, fmt.Sprintf("secret store %q holds %d secrets, the most it may; delete one first", m.GetStoreName(), s.secrets.MaxSecretsPerStore),
			map[string]string{"limit": fmt.Sprint(s.secrets.MaxSecretsPerStore), "store_name": m.GetStoreName()})
	case err != nil:
		return nil, secretsUnavailable("the secrets", err)
	}
	s.log.Info("secret set", "org", org, "store", out.Store, "path", out.Path, "field", out.Field, "key_id", kid)
	return connect.NewResponse(secretProto(out)), nil
}

// ListSecrets pages through a store's secrets: addresses and times, never values.
func (x secretService) ListSecrets(ctx context.Context, req *connect.Request[settingsv1.ListSecretsRequest]) (*connect.Response[settingsv1.ListSecretsResponse], error) {
	s, m := x.s, req.Msg
	if _, err := s.getStore(ctx, "store_name", m.GetStoreName()); err != nil {
		return nil, err
	}
	size, err := apierr.PageSize(m.GetPageSize(), defaultPageSize, maxPageSize)
	if err != nil {
		return nil, err
	}
	list, next, err := s.secrets.Store.ListSecrets(ctx, principal(ctx).Org, m.GetStoreName(), store.Page{Size: size, Token: m.GetPageToken()})
	switch {
	case errors.Is(err, store.ErrInvalid):
		return nil, invalidField("page_token", "is not a token this server issued")
	case err != nil:
		return nil, secretsUnavailable("the secrets", err)
	}
	out := &settingsv1.ListSecretsResponse{NextPageToken: next}
	for _, e := range list {
		out.Secrets = append(out.Secrets, secretProto(e))
	}
	return connect.NewResponse(out), nil
}

// DeleteSecret removes one secret (SANDBOX_ADMIN).
func (x secretService) DeleteSecret(ctx context.Context, req *connect.Request[settingsv1.DeleteSecretRequest]) (*connect.Response[emptypb.Empty], error) {
	s, m := x.s, req.Msg
	if err := requireAdmin(ctx, "DeleteSecret"); err != nil {
		return nil, err
	}
	if err := checkSecretAddress(m.GetPath(), m.GetField()); err != nil {
		return nil, err
	}
	if _, err := s.getStore(ctx, "store_name", m.GetStoreName()); err != nil {
		if m.GetAllowMissing() && apierr.Reason(err) == apierr.SecretStoreNotFound {
			return connect.NewResponse(&emptypb.Empty{}), nil
		}
		return nil, err
	}
	org := principal(ctx).Org
	err := s.secrets.Store.DeleteSecret(ctx, org, m.GetStoreName(), m.GetPath(), m.GetField())
	switch {
	case errors.Is(err, store.ErrNotFound):
		if !m.GetAllowMissing() {
			return nil, apierr.New(apierr.SecretNotFound, fmt.Sprintf("secret %s (field %q) not found in store %q", m.GetPath(), m.GetField(), m.GetStoreName()),
				map[string]string{"store_name": m.GetStoreName(), "path": m.GetPath(), "field": m.GetField()})
		}
	case err != nil:
		return nil, secretsUnavailable("the secrets", err)
	}
	s.log.Info("secret deleted", "org", org, "store", m.GetStoreName(), "path", m.GetPath(), "field", m.GetField())
	return connect.NewResponse(&emptypb.Empty{}), nil
}

// secretResolver resolves the secrets one create references, for org (nil when secret
// stores are off: references are NOT_IMPLEMENTED). Values are memoized for the create
// (Convert runs once for the shape and once per candidate runner) and bounded in all.
func (s *Server) secretResolver(ctx context.Context, org string) spec.SecretResolver {
	if !s.secrets.enabled() {
		return nil
	}
	type result struct {
		v   string
		err error
	}
	seen := map[spec.SecretRef]result{}
	stores := map[string]int32{}
	total := 0
	return func(field string, ref spec.SecretRef) (string, error) {
		if r, ok := seen[ref]; ok {
			return r.v, r.err
		}
		v, err := s.resolveSecret(ctx, org, field, ref, stores)
		if err == nil {
			if total += len(v); total > maxResolvedSecretBytes {
				vs := []apierr.Violation{{Field: "sandbox.spec.containers", Description: fmt.Sprintf("the referenced secrets hold more than %d bytes in all", maxResolvedSecretBytes)}}
				return "", apierr.Invalid(apierr.InvalidRequest, apierr.Describe(vs), vs)
			}
		}
		seen[ref] = result{v, err}
		return v, err
	}
}

// storeNameField is the violation field of a reference's store name: a secret_stores
// entry's store_name, or the credentials' store_name.
func storeNameField(field string) string {
	if i := strings.LastIndex(field, ".secrets["); i >= 0 {
		return field[:i] + ".store_name"
	}
	return field + ".store_name"
}

// kubernetesStore reports whether a store's provider is KUBERNETES (its secrets are
// Kubernetes Secrets the runner's Pod takes by reference).
func kubernetesStore(pt int32) bool {
	return pt == int32(sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_KUBERNETES)
}

// missingStore marks a store the organization does not have in resolveSecret's memo.
const missingStore = -1

func (s *Server) resolveSecret(ctx context.Context, org, field string, ref spec.SecretRef, stores map[string]int32) (string, error) {
	if err := reservedSecretStore(field, ref); err != nil {
		return "", err
	}
	ss := s.secrets.Store
	if _, ok := stores[ref.Store]; !ok {
		st, err := ss.Get(ctx, org, ref.Store)
		switch {
		case errors.Is(err, store.ErrNotFound):
			stores[ref.Store] = missingStore
		case err != nil:
			return "", secretsUnavailable("the secret stores", err)
		default:
			stores[ref.Store] = st.ProviderType
		}
	}
	if kubernetesStore(stores[ref.Store]) {
		// Resolved by the runner: a Secret of its namespace that grants this store.
		if ref.Field == "" {
			vs := []apierr.Violation{{Field: field, Description: fmt.Sprintf("secret store %q is a KUBERNETES store: field must name a key of the Secret %q", ref.Store, ref.Path)}}
			return "", apierr.WithViolations(apierr.New(apierr.SecretNotProvisioned, apierr.Describe(vs), map[string]string{"store_name": ref.Store, "path": ref.Path}), vs)
		}
		return "", spec.ErrByReference
	}
	if stores[ref.Store] == missingStore {
		vs := []apierr.Violation{{Field: storeNameField(field), Description: fmt.Sprintf("secret store %q is not provisioned in this organization", ref.Store)}}
		return "", apierr.WithViolations(apierr.New(apierr.SecretStoreNotProvisioned, apierr.Describe(vs), map[string]string{"store_name": ref.Store}), vs)
	}
	x, err := ss.GetSecret(ctx, org, ref.Store, ref.Path, ref.Field)
	switch {
	case errors.Is(err, store.ErrNotFound):
		desc := fmt.Sprintf("secret store %q has no secret at path %q", ref.Store, ref.Path)
		if ref.Field != "" {
			desc = fmt.Sprintf("secret store %q has no secret at path %q, field %q", ref.Store, ref.Path, ref.Field)
		}
		vs := []apierr.Violation{{Field: field, Description: desc}}
		return "", apierr.WithViolations(apierr.New(apierr.SecretNotProvisioned, apierr.Describe(vs), map[string]string{"store_name": ref.Store, "path": ref.Path, "field": ref.Field}), vs)
	case err != nil:
		return "", secretsUnavailable("the secrets", err)
	}
	v, err := s.secrets.Keys.Open(x.KeyID, x.Ciphertext, secretbox.AD(org, ref.Store, ref.Path, ref.Field))
	if err != nil {
		s.log.Error("secret cannot be opened", "org", org, "store", ref.Store, "path", ref.Path, "field", ref.Field, "key_id", x.KeyID, "err", err)
		return "", connect.NewError(connect.CodeInternal, fmt.Errorf("secret %s of store %q cannot be opened with this gateway's secret key file (key ID %s)", ref.Path, ref.Store, x.KeyID))
	}
	return string(v), nil
}

// shapeOnlySecrets checks secret references' shape only (a template's: its secrets are
// resolved when a sandbox is created from it); nil when secret stores are off.
func (s *Server) shapeOnlySecrets() spec.SecretResolver {
	if !s.secrets.enabled() {
		return nil
	}
	return func(field string, ref spec.SecretRef) (string, error) {
		if err := reservedSecretStore(field, ref); err != nil {
			return "", err
		}
		return "user:password", nil
	}
}

// reservedSecretStore refuses a reference to the store holding the organization's build
// storage credentials (BuildStorageSecretStore): they are the platform's to use, never a
// sandbox's (environment, image pull, egress injection alike).
func reservedSecretStore(field string, ref spec.SecretRef) error {
	if ref.Store != BuildStorageSecretStore {
		return nil
	}
	vs := []apierr.Violation{{Field: storeNameField(field), Description: fmt.Sprintf("secret store %q holds the organization's build storage credentials and is never given to a sandbox", BuildStorageSecretStore)}}
	return apierr.Invalid(apierr.InvalidRequest, apierr.Describe(vs), vs)
}
