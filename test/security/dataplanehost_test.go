package security

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
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

// TestTenantRunnerCannotCertifyAnotherHost: every client trusts the one data-plane CA for
// every runner and checks only the host name, so a data-plane certificate for a host is
// the power to be that host's data plane to every organization. A tenant organization's
// runner, registered through the real enrollment path against a real control plane over
// TLS, asks IssueDataPlaneCertificate for the platform runner's data-plane host and for
// other hosts (IPs, loopback, wildcards, names under another runner's ID, spellings a
// name check might fold: trailing dot, upper case, Unicode look-alikes): each is refused
// with a field violation on host and no certificate. Its own names
// (<runner_id>.<base-domain> and under it) are signed, and the platform's runner gets
// the host its operator set (the refusals are not vacuous).
func TestTenantRunnerCannotCertifyAnotherHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tmp := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), "dp host test CA")
	if err != nil {
		t.Fatal(err)
	}
	dpCA, err := pki.LoadOrCreateCA(filepath.Join(tmp, "dp-pki"), "dp host test data-plane CA")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(tmp, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"platform", "tenant"} {
		if err := controlplane.EnsureOrg(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	key := func(org string) string {
		k, _, err := auth.IssueKey(ctx, st, org, auth.RoleAdmin, org+" admin")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyPlatform, keyTenant := key("platform"), key("tenant")
	const domain = "sbx.example.com"
	cp, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "platform",
		CA: ca, DataPlaneCA: dpCA, EndpointDomain: domain, Logger: slog.New(slog.DiscardHandler)})
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
	register := func(k, id string) *enroll.Identity {
		t.Helper()
		admin := controlplanev1connect.NewRunnerManagementServiceClient(http.DefaultClient, apiSrv.URL, connect.WithInterceptors(connecttest.Bearer(k)))
		if _, err := admin.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
			RunnerId: id, ClusterId: "c-" + id, Zone: "z", Policy: &structpb.Struct{}}})); err != nil {
			t.Fatal(err)
		}
		tok, err := admin.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		ident, err := enroll.Register(ctx, filepath.Join(t.TempDir(), id), regAddr, tok.Msg.GetBootstrapToken(), ca.CertPEM())
		if err != nil {
			t.Fatal(err)
		}
		return ident
	}
	dpRoots := x509.NewCertPool()
	dpRoots.AddCert(dpCA.Certificate())
	// issued asks for a data-plane certificate for host as ident and checks that a client
	// verifying by the data-plane CA would accept it for host.
	issued := func(ident *enroll.Identity, host string) error {
		t.Helper()
		issue, _, err := enroll.DataPlaneCredentials(ctx, ident, host)
		if err != nil {
			return err
		}
		c, err := issue(host)
		if err != nil {
			return err
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: dpRoots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Fatalf("certificate for %s does not verify for it: %v", host, err)
		}
		if n := len(c.Leaf.DNSNames) + len(c.Leaf.IPAddresses); n != 1 {
			t.Fatalf("certificate for %s names %v %v", host, c.Leaf.DNSNames, c.Leaf.IPAddresses)
		}
		return nil
	}

	// The platform's runner serves its data plane at the host its operator set.
	plat := register(keyPlatform, "plat-1")
	const platformHost = "dp.platform.internal"
	for _, h := range []string{platformHost, "10.1.2.3", "plat-1." + domain} {
		if err := issued(plat, h); err != nil {
			t.Fatalf("platform runner's data-plane certificate for %s: %v", h, err)
		}
	}
	register(keyTenant, "tenant-b") // another tenant runner, whose names are its own

	// The tenant's runner.
	ten := register(keyTenant, "tenant-a")
	if ten.Org != "tenant" {
		t.Fatalf("tenant runner registered as %q", ten.Org)
	}
	for _, h := range []string{
		platformHost, "plat-1." + domain, "dp.plat-1." + domain,
		"10.1.2.3", "127.0.0.1", "::1", "0.0.0.0", "localhost",
		"*." + domain, "*.tenant-a." + domain, "*.plat-1." + domain,
		"tenant-b." + domain, "dp.tenant-b." + domain,
		domain, "x" + "tenant-a." + domain, "tenant-a." + domain + ".evil.net",
		"tenant-a." + domain + ".", "dp.tenant-a." + domain + ".",
		"TENANT-A." + domain, "dp.tenant-a.SBX.example.com", "Plat-1." + domain,
		"dp.plat-1." + domain + "\u200b.tenant-a." + domain, // zero-width space inside
		"dр.plat-1." + domain,                               // Cyrillic р: a look-alike of the platform's name
		"tenant-a．" + domain,                                // full-width full stop
		"tenant-a。sbx.example.com",                          // ideographic full stop
		"xn--d-kmc.plat-1." + domain,                        // the punycode of a look-alike, under the platform runner
		"tenant-a." + domain + "\x00",
		strings.Repeat("a.", 120) + "tenant-a." + domain, // > 253 bytes
	} {
		err := issued(ten, h)
		if err == nil {
			t.Errorf("tenant runner got a data-plane certificate for %q", h)
			continue
		}
		code, reason := connect.CodeOf(err), apierr.Reason(err)
		if !(code == connect.CodePermissionDenied && reason == apierr.PermissionDenied || code == connect.CodeInvalidArgument && reason == apierr.InvalidRequest) {
			t.Errorf("%q: %v (reason %q), want PERMISSION_DENIED %s (or INVALID_ARGUMENT for a malformed host)", h, err, reason, apierr.PermissionDenied)
		}
		if !slices.ContainsFunc(apierr.Violations(err), func(v apierr.Violation) bool { return v.Field == "host" }) {
			t.Errorf("%q: violations %v, want one on host", h, apierr.Violations(err))
		}
	}
	// Its own names are signed.
	for _, h := range []string{"tenant-a." + domain, "dp.tenant-a." + domain, "eu-1.dp.tenant-a." + domain} {
		if err := issued(ten, h); err != nil {
			t.Errorf("tenant runner's own name %s: %v", h, err)
		}
	}
	// And a TLS client of the platform runner's host refuses a certificate for the tenant's
	// own name (the host check the clients make is what the control plane relies on).
	issue, _, err := enroll.DataPlaneCredentials(ctx, ten, "tenant-a."+domain)
	if err != nil {
		t.Fatal(err)
	}
	c, err := issue("tenant-a." + domain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: dpRoots, DNSName: platformHost}); err == nil {
		t.Fatal("the tenant's certificate verifies for the platform's host")
	}
}
