package security

import (
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
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
	p, ctx := newTenantPlatform(t, time.Minute, "dp host test CA", "tenant")
	dpCA := p.newCA("dp host test data-plane CA")
	keyPlatform, keyTenant := p.key("platform", auth.RoleAdmin), p.key("tenant", auth.RoleAdmin)
	const domain = "sbx.example.com"
	p.startControlPlane(controlplane.Config{DataPlaneCA: dpCA, EndpointDomain: domain})
	register := func(k, id string) *enroll.Identity {
		t.Helper()
		if err := p.createRunner(k, id); err != nil {
			t.Fatal(err)
		}
		return p.mustRegister(k, id)
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
