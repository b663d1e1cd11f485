package security

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// dialerFrom dials from the loopback address src.
func dialerFrom(src string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
}

// sandboxesFrom is d.sandboxes(key) whose connections come from src, with
// X-Forwarded-For xff ("" = none) on every call.
func (d *Dev) sandboxesFrom(key, src, xff string) sandboxv1connect.SandboxServiceClient {
	hc := &http.Client{Transport: &http.Transport{DialContext: dialerFrom(src).DialContext}}
	hdr := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if xff != "" {
				req.Header().Set("X-Forwarded-For", xff)
			}
			return next(ctx, req)
		}
	})
	return sandboxv1connect.NewSandboxServiceClient(hc, d.API, connect.WithInterceptors(connecttest.Bearer(key), hdr))
}

// TestSourceIPAllowlist: with the runner's control_plane_access.source_ip_allowlist at
// 127.0.0.1 (the server trusts no proxy), a caller from 127.0.0.2 can neither create a
// sandbox nor touch one an allowed caller created — exec, files, logs, get, connect,
// delete — even when it claims to be 127.0.0.1 in X-Forwarded-For; and a data-plane
// certificate obtained from the allowed address does not open the runner's direct data
// plane from the refused one.
func TestSourceIPAllowlist(t *testing.T) {
	d := needDev(t)
	setPolicy(t, d, `{"control_plane_access": {"source_ip_allowlist": ["127.0.0.1"]}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	good := d.sandboxesFrom(d.KeyA, "127.0.0.1", "")
	refused := map[string]sandboxv1connect.SandboxServiceClient{
		"127.0.0.2":                          d.sandboxesFrom(d.KeyA, "127.0.0.2", ""),
		"127.0.0.2 claiming 127.0.0.1 (XFF)": d.sandboxesFrom(d.KeyA, "127.0.0.2", "127.0.0.1"),
		"127.0.0.2 claiming 127.0.0.1 twice": d.sandboxesFrom(d.KeyA, "127.0.0.2", "127.0.0.1, 127.0.0.1"),
	}
	deny := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.SourceIPNotAllowed || !strings.Contains(err.Error(), "127.0.0.2") {
			t.Errorf("%s: %v, want PERMISSION_DENIED %s naming 127.0.0.2", what, err, apierr.SourceIPNotAllowed)
		}
	}
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "sleep", Args: []string{"300"}}}}
	for name, c := range refused {
		_, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
		deny("create from "+name, err)
	}

	id := runningSandbox(t, good, "", nil)
	if _, err := execOut(ctx, good, id, "true"); err != nil {
		t.Fatalf("exec from the allowed address: %v", err)
	}
	pk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, pk)
	connectReq := func() *connect.Request[sandboxv1.ConnectSandboxRequest] {
		return connect.NewRequest(&sandboxv1.ConnectSandboxRequest{SandboxId: id, CsrDer: csr,
			RequestedPermissions: []sandboxv1.SandboxDataPermission{sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC}})
	}
	for name, c := range refused {
		_, err := execOut(ctx, c, id, "id")
		deny("exec from "+name, err)
		_, err = c.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: id, Path: "/etc/passwd"}))
		deny("read file from "+name, err)
		_, err = c.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: id, Path: "/tmp/x", Content: []byte("x")}))
		deny("write file from "+name, err)
		_, err = c.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		deny("get from "+name, err)
		_, err = c.ConnectSandbox(ctx, connectReq())
		deny("connect from "+name, err)
		if s, err := c.StreamLogs(ctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: id})); err == nil {
			for s.Receive() {
				t.Errorf("logs from %s: got a line", name)
				break
			}
			deny("logs from "+name, s.Err())
			s.Close()
		} else {
			deny("logs from "+name, err)
		}
		_, err = c.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		deny("delete from "+name, err)
	}
	if _, err := execOut(ctx, good, id, "true"); err != nil {
		t.Fatalf("the sandbox after the refused calls: %v", err)
	}

	// The direct data plane: a certificate issued to the allowed address, used from the
	// refused one.
	res, err := good.ConnectSandbox(ctx, connectReq())
	if connect.CodeOf(err) == connect.CodeUnimplemented {
		t.Log("no direct data plane here: the gateway checks were all")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(res.Msg.GetEndpointUri())
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{PrivateKey: pk}
	for rest := res.Msg.GetClientCertificateChainPem(); ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		cert.Certificate = append(cert.Certificate, blk.Bytes)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(res.Msg.GetServerCaBundlePem())
	direct := func(src string) sandboxv1connect.SandboxDataPlaneServiceClient {
		tc := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: u.Hostname(), NextProtos: []string{"h2"}}
		p := new(http.Protocols)
		p.SetHTTP2(true)
		hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, Protocols: p, ForceAttemptHTTP2: true, DialContext: dialerFrom(src).DialContext}}
		return sandboxv1connect.NewSandboxDataPlaneServiceClient(hc, "https://"+u.Host, connect.WithGRPC())
	}
	execReq := connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"true"}})
	if _, err := direct("127.0.0.1").Exec(ctx, execReq); err != nil {
		t.Fatalf("direct exec from the allowed address: %v", err)
	}
	execReq.Header().Set("X-Forwarded-For", "127.0.0.1")
	_, err = direct("127.0.0.2").Exec(ctx, execReq)
	deny("direct exec from 127.0.0.2", err)
}
