package sbxcli

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
)

// fakeSecrets is SettingsService's secret stores and SecretService, in memory.
type fakeSecrets struct {
	sandboxv1connect.UnimplementedSettingsServiceHandler
	settingsv1connect.UnimplementedSecretServiceHandler
	mu      sync.Mutex
	stores  []string
	values  map[string]string // store/path#field
	deleted []string
}

func (f *fakeSecrets) CreateSecretStore(_ context.Context, r *connect.Request[sandboxv1.CreateSecretStoreRequest]) (*connect.Response[sandboxv1.SecretStore], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stores = append(f.stores, r.Msg.GetSecretStore().GetName())
	return connect.NewResponse(&sandboxv1.SecretStore{Name: r.Msg.GetSecretStore().GetName(), ProviderType: r.Msg.GetSecretStore().GetProviderType(), CreateTime: timestamppb.Now()}), nil
}

func (f *fakeSecrets) ListSecretStores(context.Context, *connect.Request[sandboxv1.ListSecretStoresRequest]) (*connect.Response[sandboxv1.ListSecretStoresResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &sandboxv1.ListSecretStoresResponse{}
	for _, s := range f.stores {
		out.SecretStores = append(out.SecretStores, &sandboxv1.SecretStore{Name: s, ProviderType: sandboxv1.SecretStoreProviderType_SECRET_STORE_PROVIDER_TYPE_SANDBOXD, CreateTime: timestamppb.Now()})
	}
	return connect.NewResponse(out), nil
}

func (f *fakeSecrets) DeleteSecretStore(_ context.Context, r *connect.Request[sandboxv1.DeleteSecretStoreRequest]) (*connect.Response[emptypb.Empty], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, "store:"+r.Msg.GetName())
	return connect.NewResponse(&emptypb.Empty{}), nil
}

func (f *fakeSecrets) PutSecret(_ context.Context, r *connect.Request[settingsv1.PutSecretRequest]) (*connect.Response[settingsv1.Secret], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[r.Msg.GetStoreName()+"/"+r.Msg.GetPath()+"#"+r.Msg.GetField()] = r.Msg.GetValue()
	return connect.NewResponse(&settingsv1.Secret{StoreName: r.Msg.GetStoreName(), Path: r.Msg.GetPath(), Field: r.Msg.GetField()}), nil
}

func (f *fakeSecrets) ListSecrets(_ context.Context, r *connect.Request[settingsv1.ListSecretsRequest]) (*connect.Response[settingsv1.ListSecretsResponse], error) {
	return connect.NewResponse(&settingsv1.ListSecretsResponse{Secrets: []*settingsv1.Secret{{StoreName: r.Msg.GetStoreName(), Path: "db/main", Field: "password", UpdateTime: timestamppb.Now()}}}), nil
}

func (f *fakeSecrets) DeleteSecret(_ context.Context, r *connect.Request[settingsv1.DeleteSecretRequest]) (*connect.Response[emptypb.Empty], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, r.Msg.GetStoreName()+"/"+r.Msg.GetPath()+"#"+r.Msg.GetField())
	return connect.NewResponse(&emptypb.Empty{}), nil
}

func TestSbxSecret(t *testing.T) {
	f := &fakeSecrets{values: map[string]string{}}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSettingsServiceHandler(f))
	mux.Handle(settingsv1connect.NewSecretServiceHandler(f))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	sbx := func(stdin string, args ...string) (string, string, int) {
		return runSbx(context.Background(), stdin, append([]string{"--base-url", "http://" + ln.Addr().String(), "--api-key", "k"}, args...)...)
	}
	if out, errs, code := sbx("", "secret", "store", "create", "prod"); code != 0 || out != "prod\n" {
		t.Fatalf("store create: %q %q %d", out, errs, code)
	}
	// A KUBERNETES store (its values are Secrets in the runner's namespace).
	if out, errs, code := sbx("", "-o", "json", "secret", "store", "create", "kube", "--provider", "kubernetes"); code != 0 || !strings.Contains(out, "SECRET_STORE_PROVIDER_TYPE_KUBERNETES") {
		t.Fatalf("store create --provider kubernetes: %q %q %d", out, errs, code)
	}
	if _, errs, code := sbx("", "secret", "store", "create", "x", "--provider", "wandb"); code == 0 || !strings.Contains(errs, "sandboxd or kubernetes") {
		t.Fatalf("store create --provider wandb: %q %d", errs, code)
	}
	// The value comes from stdin only, one trailing newline dropped.
	if out, errs, code := sbx("hunter2\n", "secret", "set", "prod", "db/main", "password"); code != 0 || out != "" {
		t.Fatalf("set: %q %q %d", out, errs, code)
	}
	if got := f.values["prod/db/main#password"]; got != "hunter2" {
		t.Fatalf("stored value %q", got)
	}
	if _, _, code := sbx("multi\nline\n", "secret", "set", "prod", "cert"); code != 0 || f.values["prod/cert#"] != "multi\nline" {
		t.Fatalf("default field: %d %q", code, f.values["prod/cert#"])
	}
	if _, errs, code := sbx("x", "secret", "set", "prod"); code == 0 || !strings.Contains(errs, "arg") {
		t.Fatalf("set without a path: %q %d", errs, code)
	}
	out, _, code := sbx("", "secret", "ls", "prod")
	if code != 0 || !strings.Contains(out, "db/main") || !strings.Contains(out, "password") || strings.Contains(out, "hunter2") {
		t.Fatalf("ls: %q %d", out, code)
	}
	out, _, code = sbx("", "-o", "json", "secret", "store", "ls")
	if code != 0 || !strings.Contains(out, `"name":"prod"`) && !strings.Contains(out, `"name": "prod"`) {
		t.Fatalf("store ls json: %q %d", out, code)
	}
	if _, _, code := sbx("", "secret", "rm", "prod", "db/main", "password"); code != 0 {
		t.Fatalf("rm: %d", code)
	}
	if _, _, code := sbx("", "secret", "store", "rm", "prod"); code != 0 {
		t.Fatalf("store rm: %d", code)
	}
	if strings.Join(f.deleted, ",") != "prod/db/main#password,store:prod" {
		t.Fatalf("deleted %v", f.deleted)
	}
}
