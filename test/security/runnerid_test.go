package security

import (
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/pki"
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
	p, ctx := newTenantPlatform(t, time.Minute, "runner id test CA", "org-b")
	p.ensureRunner("platform", "r1")
	keyPlatform, keyB := p.key("platform", auth.RoleAdmin), p.key("org-b", auth.RoleAdmin)
	p.startControlPlane(controlplane.Config{DataPlaneCA: p.newCA("runner id test data-plane CA")})
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
	wantRefused("org-b creates r1", p.createRunner(keyB, "r1"), connect.CodeAlreadyExists, apierr.AlreadyExists)
	if _, err := p.St.Runners().Get(ctx, "org-b", "r1"); err == nil {
		t.Fatal("org-b's r1 exists")
	}

	// 2. A duplicate r1 of org-b, forced into the store after the platform's.
	if err := p.createRunner(keyB, "b-dup"); err != nil {
		t.Fatal(err)
	}
	forceRunnerID(t, p.DB, "org-b", "b-dup", "r1")

	// Its registration gets no runner certificate naming r1.
	if id, err := p.register(keyB, "r1"); err == nil {
		t.Fatalf("org-b registered r1: certificate names %v", id.Cert.Leaf)
	} else {
		wantRefused("org-b registers its duplicate r1", err, connect.CodeFailedPrecondition, apierr.RunnerIDTaken)
	}
	// A runner certificate naming org-b's r1, as a control plane without the check issued.
	legacy, err := p.CA.IssueClient("sandboxd runner r1", []*url.URL{pki.RunnerURI("org-b", "r1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bID := &enroll.Identity{Org: "org-b", RunnerID: "r1", ControlPlane: p.RegAddr, Cert: legacy, CAs: p.CA.Pool(), CAPEM: p.CA.CertPEM(), CA: p.CA.Certificate()}
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
	pID, err := p.register(keyPlatform, "r1")
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
	roots.AddCert(p.CA.Certificate())
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
