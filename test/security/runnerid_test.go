package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestTenantCannotTakeAnotherOrgsRunnerName: runner IDs name a runner's public endpoints
// (*.<runner_id>.<domain>, its edge certificate) and its runner certificate (DNS name
// <runner_id>). Organization org-b tries to get certificates for the platform's runner
// r1: creating a runner r1 of its own is refused (ALREADY_EXISTS, the platform not
// named); with a duplicate r1 forced into the store (a database from before runner IDs
// were unique across organizations), org-b's registration of it is refused, and a
// runner certificate naming org-b's r1 (as an older control plane issued) gets neither
// an edge certificate for *.r1.<domain> nor a data-plane certificate. The platform's r1
// gets both (the refusals are not vacuous).
func TestTenantCannotTakeAnotherOrgsRunnerName(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tmp := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), "runner id test CA")
	if err != nil {
		t.Fatal(err)
	}
	dpCA, err := pki.LoadOrCreateCA(filepath.Join(tmp, "dp-pki"), "runner id test data-plane CA")
	if err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(tmp, "sandboxd.db")
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"platform", "org-b"} {
		if err := controlplane.EnsureOrg(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := controlplane.EnsureRunner(ctx, st, store.Runner{Org: "platform", RunnerID: "r1", ClusterID: "c-r1", Zone: "z"}); err != nil {
		t.Fatal(err)
	}
	key := func(org string) string {
		k, _, err := auth.IssueKey(ctx, st, org, auth.RoleAdmin, org+" admin")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyPlatform, keyB := key("platform"), key("org-b")

	cp, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "platform",
		CA: ca, DataPlaneCA: dpCA, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cpTLS, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	regSrv := httptest.NewUnstartedServer(cp.TLSHandler())
	regSrv.TLS = cpTLS
	regSrv.EnableHTTP2 = true
	regSrv.StartTLS()
	t.Cleanup(regSrv.Close)
	regAddr := strings.Replace(regSrv.URL, "https://127.0.0.1", "localhost", 1)
	apiSrv := httptest.NewServer(cp.Handler())
	t.Cleanup(apiSrv.Close)
	admin := func(k string) controlplanev1connect.RunnerManagementServiceClient {
		return controlplanev1connect.NewRunnerManagementServiceClient(http.DefaultClient, apiSrv.URL, connect.WithInterceptors(connecttest.Bearer(k)))
	}
	create := func(k, id string) error {
		_, err := admin(k).CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
			RunnerId: id, ClusterId: "c-" + id, Zone: "z", Policy: &structpb.Struct{}}}))
		return err
	}
	register := func(k, id string) (*enroll.Identity, error) {
		tok, err := admin(k).CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return enroll.Register(ctx, filepath.Join(t.TempDir(), id), regAddr, tok.Msg.GetBootstrapToken(), ca.CertPEM())
	}
	wantRefused := func(what string, err error, code connect.Code, reason string) {
		t.Helper()
		if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
			t.Fatalf("%s: err = %v (reason %q), want %v %s", what, err, apierr.Reason(err), code, reason)
		}
		if strings.Contains(err.Error(), "platform") {
			t.Fatalf("%s: the error names the other organization: %v", what, err)
		}
	}

	// 1. org-b cannot create a runner of the platform runner's ID.
	wantRefused("org-b creates r1", create(keyB, "r1"), connect.CodeAlreadyExists, apierr.AlreadyExists)
	if _, err := st.Runners().Get(ctx, "org-b", "r1"); err == nil {
		t.Fatal("org-b's r1 exists")
	}

	// 2. A duplicate r1 of org-b, forced into the store after the platform's.
	if err := create(keyB, "b-dup"); err != nil {
		t.Fatal(err)
	}
	forceRunnerID(t, dbPath, "org-b", "b-dup", "r1")

	// Its registration gets no runner certificate naming r1.
	if id, err := register(keyB, "r1"); err == nil {
		t.Fatalf("org-b registered r1: certificate names %v", id.Cert.Leaf)
	} else {
		wantRefused("org-b registers its duplicate r1", err, connect.CodeFailedPrecondition, apierr.RunnerIDTaken)
	}
	// A runner certificate naming org-b's r1, as a control plane without the check issued.
	legacy, err := ca.IssueClient("sandboxd runner r1", []*url.URL{pki.RunnerURI("org-b", "r1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bID := &enroll.Identity{Org: "org-b", RunnerID: "r1", ControlPlane: regAddr, Cert: legacy, CAs: ca.Pool(), CAPEM: ca.CertPEM(), CA: ca.Certificate()}
	if _, err := enroll.EdgeCertificate(ctx, bID, controlplane.DefaultEndpointDomain); err == nil {
		t.Fatal("org-b's runner got an edge certificate for *.r1." + controlplane.DefaultEndpointDomain)
	} else {
		wantRefused("org-b's edge certificate for r1", err, connect.CodeFailedPrecondition, apierr.RunnerIDTaken)
	}
	if _, _, err := enroll.DataPlaneCredentials(ctx, bID, pki.TenantDataPlaneHost("r1", controlplane.DefaultEndpointDomain)); err == nil {
		t.Fatal("org-b's runner r1 got a data-plane certificate")
	} else {
		wantRefused("org-b's data-plane certificate", err, connect.CodeFailedPrecondition, apierr.RunnerIDTaken)
	}

	// The platform's r1 registers and gets its edge certificate.
	pID, err := register(keyPlatform, "r1")
	if err != nil {
		t.Fatal(err)
	}
	get, err := enroll.EdgeCertificate(ctx, pID, controlplane.DefaultEndpointDomain)
	if err != nil {
		t.Fatal(err)
	}
	host := "8080-abcdefghijklmnop.r1." + controlplane.DefaultEndpointDomain
	cert, err := get(&tls.ClientHelloInfo{ServerName: host})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
		t.Fatalf("platform's edge certificate: %v", err)
	}
}

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
