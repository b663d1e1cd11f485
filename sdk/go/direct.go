package sandbox

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
)

// DataPlaneMode says how exec, logs and file calls reach a running sandbox.
type DataPlaneMode string

// Data plane modes, as the official client has them.
const (
	// DataPlaneAuto goes direct when the sandbox's runner offers it and it answers within
	// a second; otherwise through the gateway, trying direct again after 30 s.
	DataPlaneAuto DataPlaneMode = "auto"
	// DataPlaneDirect always goes direct, and fails when that is not possible.
	DataPlaneDirect DataPlaneMode = "direct"
	// DataPlaneGateway never goes direct.
	DataPlaneGateway DataPlaneMode = "gateway"
)

// ParseDataPlaneMode reads "auto", "direct" or "gateway".
func ParseDataPlaneMode(s string) (DataPlaneMode, error) {
	switch m := DataPlaneMode(s); m {
	case DataPlaneAuto, DataPlaneDirect, DataPlaneGateway:
		return m, nil
	}
	return "", fmt.Errorf("data plane mode %q: want auto, direct or gateway", s)
}

// WithDataPlane sets the data plane mode (default DataPlaneAuto).
func WithDataPlane(m DataPlaneMode) Option { return func(c *config) { c.dataPlane = m } }

// Limits of the direct path.
const (
	directBudget = time.Second      // AUTO: credentials and a TLS handshake within this
	directRetry  = 30 * time.Second // AUTO: after a failure, the gateway for this long
	renewBefore  = time.Minute      // credentials this close to expiry are replaced
)

// dataClient is what exec, logs and files need: both the gateway's SandboxService and a
// runner's SandboxDataPlaneService offer it, with the same messages.
type dataClient interface {
	Exec(context.Context, *connect.Request[sandboxv1.ExecRequest]) (*connect.Response[sandboxv1.ExecResponse], error)
	StreamExec(context.Context) *connect.BidiStreamForClient[sandboxv1.ExecStreamRequest, sandboxv1.ExecStreamResponse]
	StreamLogs(context.Context, *connect.Request[sandboxv1.StreamLogsRequest]) (*connect.ServerStreamForClient[sandboxv1.LogEntry], error)
	WriteFile(context.Context, *connect.Request[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error)
	ReadFile(context.Context, *connect.Request[sandboxv1.ReadFileRequest]) (*connect.Response[sandboxv1.ReadFileResponse], error)
}

// direct holds the direct connections of a Client: per sandbox and permission (a
// certificate carries the permissions it was asked for), until they near expiry.
type direct struct {
	mode DataPlaneMode

	mu      sync.Mutex
	conns   map[directKey]*directConn
	retryAt map[string]time.Time // sandbox → when AUTO tries direct again
}

type directKey struct {
	sandbox string
	perm    sandboxv1.SandboxDataPermission
}

type directConn struct {
	client  sandboxv1connect.SandboxDataPlaneServiceClient
	hc      *http.Client
	expires time.Time
}

// data returns the client for perm on sandbox s: direct or the gateway, per the mode.
func (s *Sandbox) data(ctx context.Context, perm sandboxv1.SandboxDataPermission) (dataClient, error) {
	d := s.c.direct
	if d.mode == DataPlaneGateway {
		return s.c.svc, nil
	}
	d.mu.Lock()
	k := directKey{s.id, perm}
	if c := d.conns[k]; c != nil && time.Until(c.expires) > renewBefore {
		d.mu.Unlock()
		return c.client, nil
	}
	if d.mode == DataPlaneAuto && time.Now().Before(d.retryAt[s.id]) {
		d.mu.Unlock()
		return s.c.svc, nil
	}
	d.mu.Unlock()

	cctx, cancel := ctx, context.CancelFunc(func() {})
	if d.mode == DataPlaneAuto {
		cctx, cancel = context.WithTimeout(ctx, directBudget)
	}
	c, err := s.connect(cctx, perm)
	cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		if d.mode == DataPlaneDirect {
			return nil, fmt.Errorf("sandbox %s: direct data plane: %w", s.id, err)
		}
		d.retryAt[s.id] = time.Now().Add(directRetry)
		return s.c.svc, nil
	}
	if old := d.conns[k]; old != nil {
		old.hc.CloseIdleConnections()
	}
	d.conns[k] = c
	return c.client, nil
}

// connect asks the gateway for a certificate for a fresh key (the key never leaves this
// process) and checks that the runner's data plane answers a TLS handshake with it.
func (s *Sandbox) connect(ctx context.Context, perm sandboxv1.SandboxDataPermission) (*directConn, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, err
	}
	res, err := s.c.svc.ConnectSandbox(ctx, connect.NewRequest(&sandboxv1.ConnectSandboxRequest{
		SandboxId: s.id, CsrDer: csr, RequestedPermissions: []sandboxv1.SandboxDataPermission{perm}}))
	if err != nil {
		return nil, fromRPC(err)
	}
	m := res.Msg
	u, err := url.Parse(m.GetEndpointUri())
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("endpoint %q is not an https URL", m.GetEndpointUri())
	}
	cert := tls.Certificate{PrivateKey: key}
	for rest := m.GetClientCertificateChainPem(); ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		cert.Certificate = append(cert.Certificate, blk.Bytes)
	}
	roots := x509.NewCertPool()
	if len(cert.Certificate) == 0 || !roots.AppendCertsFromPEM(m.GetServerCaBundlePem()) {
		return nil, errors.New("the credentials carry no certificate or no server CA")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: roots,
		ServerName: u.Hostname(), NextProtos: []string{"h2"}}
	// The port may be blocked: find out now, within the caller's budget.
	conn, err := (&tls.Dialer{Config: tc}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("data plane %s: %w", u.Host, err)
	}
	_ = conn.Close()
	p := new(http.Protocols)
	p.SetHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Protocols: p, ForceAttemptHTTP2: true,
		DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext}}
	client := sandboxv1connect.NewSandboxDataPlaneServiceClient(hc, "https://"+u.Host,
		connect.WithGRPC(), connect.WithReadMaxBytes(MaxMessageBytes), connect.WithSendMaxBytes(MaxMessageBytes),
		// Not offering gzip keeps a runner from before the data plane stopped compressing
		// from gzipping every file read (~60 MB/s of CPU on incompressible content).
		connect.WithAcceptCompression("gzip", nil, nil))
	return &directConn{client: client, hc: hc, expires: m.GetExpiresAt().AsTime()}, nil
}
