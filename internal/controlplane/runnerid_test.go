package controlplane_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"database/sql"
	"encoding/pem"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/store"
)

// forceRunnerID renames org's runner from to to in the SQLite database at path,
// bypassing the store's check: a runner ID duplicated across organizations, as a
// database from before runner IDs were unique across organizations may hold.
func forceRunnerID(t *testing.T, path, org, from, to string) {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := db.ExecContext(t.Context(), `UPDATE runners SET runner_id = ? WHERE org_id = ? AND runner_id = ?`, to, org, from)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("renamed %d runners %s/%s", n, org, from)
	}
}

type idBed struct {
	path             string
	st               store.Store
	svc              *controlplane.Service
	platform, tenant context.Context
}

func newIDBed(t *testing.T) *idBed {
	t.Helper()
	ctx := t.Context()
	b := &idBed{path: filepath.Join(t.TempDir(), "cp.db")}
	var err error
	if b.st, err = store.Open(ctx, b.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.st.Close() })
	for _, o := range []string{"plat", "tenant"} {
		if err := controlplane.EnsureOrg(ctx, b.st, o); err != nil {
			t.Fatal(err)
		}
	}
	b.svc, err = controlplane.New(controlplane.Config{Store: b.st, Auth: auth.NewStoreAuthenticator(b.st, nil), PlatformOrg: "plat",
		Logger: slog.New(slog.DiscardHandler), CA: testCA(t), DataPlaneCA: testCA(t)})
	if err != nil {
		t.Fatal(err)
	}
	b.platform = auth.WithPrincipal(ctx, auth.Principal{KeyID: "k1", Org: "plat", Role: auth.RoleAdmin})
	b.tenant = auth.WithPrincipal(ctx, auth.Principal{KeyID: "k2", Org: "tenant", Role: auth.RoleAdmin})
	return b
}

func (b *idBed) create(ctx context.Context, id string) error {
	_, err := b.svc.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: id, ClusterId: "c-" + id, Zone: "z1", Policy: &structpb.Struct{}}}))
	return err
}

func csrPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func parseChain(t *testing.T, chain string) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode([]byte(chain))
	if blk == nil {
		t.Fatalf("no certificate in %q", chain)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCreateRefusesRunnerIDOfAnotherOrg: a runner_id another organization's runner has
// is ALREADY_EXISTS, without naming that organization; once that runner is deleted the
// ID stays its organization's for the longest certificate lifetime.
func TestCreateRefusesRunnerIDOfAnotherOrg(t *testing.T) {
	b := newIDBed(t)
	if err := b.create(b.platform, "r1"); err != nil {
		t.Fatal(err)
	}
	err := b.create(b.tenant, "r1")
	wantReason(t, "tenant's r1", err, connect.CodeAlreadyExists, apierr.AlreadyExists)
	if strings.Contains(err.Error(), "plat") {
		t.Fatalf("the error names the other organization: %v", err)
	}
	if _, err := b.st.Runners().Get(t.Context(), "tenant", "r1"); err == nil {
		t.Fatal("the tenant's r1 was created")
	}
	if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
		t.Fatal(err)
	}
	// Certificates naming r1 outlive the platform's runner: the ID stays the
	// platform's (store.RunnerIDHold), which may create it again.
	wantReason(t, "tenant's r1 after the platform deleted its own", b.create(b.tenant, "r1"), connect.CodeAlreadyExists, apierr.AlreadyExists)
	if err := b.create(b.platform, "r1"); err != nil {
		t.Fatalf("the platform's r1 again: %v", err)
	}
}

// TestReservedRunnerIDPrefix: runner IDs beginning "platform-" are the platform
// organization's: a tenant's admin is refused (PERMISSION_DENIED
// CWSANDBOX_RUNNER_ID_RESERVED naming managed_runner.runner_id, nothing created), even
// for an ID no one has; the platform's admin creates it; an ID merely containing the
// word is anyone's.
func TestReservedRunnerIDPrefix(t *testing.T) {
	b := newIDBed(t)
	err := b.create(b.tenant, "platform-edge-1")
	wantReason(t, "tenant's platform-edge-1", err, connect.CodePermissionDenied, apierr.RunnerIDReserved)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "managed_runner.runner_id" {
		t.Errorf("violations %v, want one on managed_runner.runner_id", vs)
	}
	if _, err := b.st.Runners().Get(t.Context(), "tenant", "platform-edge-1"); err == nil {
		t.Fatal("the tenant's platform-edge-1 was created")
	}
	if err := b.create(b.platform, "platform-edge-1"); err != nil {
		t.Fatalf("the platform's platform-edge-1: %v", err)
	}
	for _, id := range []string{"my-platform-1", "platform", "platformx-1"} {
		if err := b.create(b.tenant, id); err != nil {
			t.Errorf("tenant's %s: %v", id, err)
		}
	}
}

// TestNoCertificateForDuplicatedRunnerID: with a runner ID both the platform's and (a
// duplicate from older data) the tenant's runner have, only the earlier (the
// platform's) gets certificates naming it: edge (*.r1.<domain>), data plane and
// registration; the tenant's runner is refused with CWSANDBOX_RUNNER_ID_TAKEN. A
// deleted runner gets none.
func TestNoCertificateForDuplicatedRunnerID(t *testing.T) {
	b := newIDBed(t)
	ctx := t.Context()
	if err := b.create(b.platform, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := b.create(b.tenant, "r1-dup"); err != nil {
		t.Fatal(err)
	}
	forceRunnerID(t, b.path, "tenant", "r1-dup", "r1")
	reg := b.svc.Registration()
	edge := func(org, id string) (*connect.Response[controlplanev1.IssueEdgeCertificateResponse], error) {
		return reg.IssueEdgeCertificate(controlplane.WithRunnerCert(ctx, org, id), connect.NewRequest(&controlplanev1.IssueEdgeCertificateRequest{
			CsrPem: csrPEM(t), BaseDomain: controlplane.DefaultEndpointDomain}))
	}
	dp := func(org, id string) (*connect.Response[controlplanev1.IssueDataPlaneCertificateResponse], error) {
		return reg.IssueDataPlaneCertificate(controlplane.WithRunnerCert(ctx, org, id), connect.NewRequest(&controlplanev1.IssueDataPlaneCertificateRequest{
			CsrPem: csrPEM(t), Host: "10.0.0.1"}))
	}
	register := func(actx context.Context, id string) (*connect.Response[controlplanev1.RegisterResponse], error) {
		tok, err := b.svc.CreateBootstrapToken(actx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return reg.Register(ctx, connect.NewRequest(&controlplanev1.RegisterRequest{BootstrapToken: tok.Msg.GetBootstrapToken(), CsrPem: csrPEM(t)}))
	}

	_, err := edge("tenant", "r1")
	wantReason(t, "tenant's edge certificate", err, connect.CodeFailedPrecondition, apierr.RunnerIDTaken)
	if strings.Contains(err.Error(), "plat") {
		t.Fatalf("the error names the other organization: %v", err)
	}
	_, err = dp("tenant", "r1")
	wantReason(t, "tenant's data-plane certificate", err, connect.CodeFailedPrecondition, apierr.RunnerIDTaken)
	_, err = register(b.tenant, "r1")
	wantReason(t, "tenant's registration", err, connect.CodeFailedPrecondition, apierr.RunnerIDTaken)

	// The holder is served (so the refusals are not vacuous).
	res, err := edge("plat", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if c := parseChain(t, res.Msg.GetCertificateChainPem()); !slices.Equal(c.DNSNames, []string{"*.r1." + controlplane.DefaultEndpointDomain}) {
		t.Fatalf("platform's edge certificate names %v", c.DNSNames)
	}
	if _, err := dp("plat", "r1"); err != nil {
		t.Fatal(err)
	}
	rr, err := register(b.platform, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if c := parseChain(t, rr.Msg.GetCertificateChainPem()); rr.Msg.GetOrg() != "plat" || !slices.Equal(c.DNSNames, []string{"r1"}) {
		t.Fatalf("platform's registration: %s, %v", rr.Msg.GetOrg(), c.DNSNames)
	}

	// The platform's runner deleted: the tenant's duplicate is the only holder now.
	if _, err := b.svc.DeleteManagedRunner(b.platform, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"})); err != nil {
		t.Fatal(err)
	}
	if _, err := edge("tenant", "r1"); err != nil {
		t.Fatalf("tenant's edge certificate as the only holder: %v", err)
	}
	// A runner that no longer exists gets no certificate, whatever its old one says.
	_, err = edge("plat", "r1")
	wantReason(t, "deleted runner's edge certificate", err, connect.CodeNotFound, apierr.RunnerNotFound)
	_, err = edge("plat", "gone")
	wantReason(t, "never-existing runner's edge certificate", err, connect.CodeNotFound, apierr.RunnerNotFound)
	_, err = dp("plat", "gone")
	wantReason(t, "never-existing runner's data-plane certificate", err, connect.CodeNotFound, apierr.RunnerNotFound)
}

// TestDataPlaneHostOfTenantRunner: a tenant organization's runner gets a data-plane
// certificate only for <runner_id>.<domain> and names under it (PERMISSION_DENIED with a
// violation on host and the allowed host in the metadata otherwise); the platform's
// runner for the host its operator set, an IP included.
func TestDataPlaneHostOfTenantRunner(t *testing.T) {
	b := newIDBed(t)
	ctx := t.Context()
	if err := b.create(b.platform, "p1"); err != nil {
		t.Fatal(err)
	}
	if err := b.create(b.tenant, "t1"); err != nil {
		t.Fatal(err)
	}
	reg := b.svc.Registration()
	dp := func(org, id, host string) (*x509.Certificate, error) {
		res, err := reg.IssueDataPlaneCertificate(controlplane.WithRunnerCert(ctx, org, id), connect.NewRequest(&controlplanev1.IssueDataPlaneCertificateRequest{
			CsrPem: csrPEM(t), Host: host}))
		if err != nil {
			return nil, err
		}
		return parseChain(t, res.Msg.GetCertificateChainPem()), nil
	}
	own := "t1." + controlplane.DefaultEndpointDomain
	for _, h := range []string{"10.0.0.1", "p1." + controlplane.DefaultEndpointDomain, "dp.platform.internal", "T1." + controlplane.DefaultEndpointDomain, own + "."} {
		_, err := dp("tenant", "t1", h)
		wantReason(t, "tenant's runner for "+h, err, connect.CodePermissionDenied, apierr.PermissionDenied)
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "host" {
			t.Errorf("%s: violations %v", h, vs)
		}
		if md := apierr.Info(err).GetMetadata(); md["allowed_host"] != own || md["runner_id"] != "t1" {
			t.Errorf("%s: metadata %v", h, md)
		}
	}
	for _, h := range []string{own, "dp." + own} {
		c, err := dp("tenant", "t1", h)
		if err != nil {
			t.Fatalf("tenant's own %s: %v", h, err)
		}
		if !slices.Equal(c.DNSNames, []string{h}) || len(c.IPAddresses) != 0 {
			t.Fatalf("tenant's certificate for %s names %v %v", h, c.DNSNames, c.IPAddresses)
		}
	}
	d := controlplane.DefaultEndpointDomain
	for _, h := range []string{"10.0.0.1", "dp.platform.internal", "p1." + d, "dp.p1." + d, "platform-dp." + d, "x.platform-dp." + d} {
		if _, err := dp("plat", "p1", h); err != nil {
			t.Errorf("platform runner for %s: %v", h, err)
		}
	}
	// In the base domain, a platform runner's name must be one no tenant's runner can hold:
	// "dp.<domain>" would be the host of a tenant runner named "dp".
	for _, h := range []string{"dp." + d, "DP." + d, "dp." + d + ".", d, "t1." + d, "x.t1." + d, "x.dp." + d} {
		_, err := dp("plat", "p1", h)
		wantReason(t, "platform runner for "+h, err, connect.CodePermissionDenied, apierr.PermissionDenied)
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "host" {
			t.Errorf("%s: violations %v", h, vs)
		}
	}
}
