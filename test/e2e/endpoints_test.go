package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/sockmark"
	"github.com/sandboxd/sandboxd/internal/stack"
)

const endpointDomain = "sandboxd.localhost"

// edgeGateway is a gateway whose runner publishes endpoints through an edge on loopback.
type edgeGateway struct {
	*gw
	stack  *stack.Stack
	edge   *stack.Edge
	caFile string
	ca     *pki.CA
	local  *runner.Local
	keys   gateway.Authenticator
}

func startEdgeGateway(t *testing.T) *edgeGateway {
	t.Helper()
	eg := &edgeGateway{}
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir, "edge test CA")
	if err != nil {
		t.Fatal(err)
	}
	eg.ca, eg.caFile = ca, dir+"/ca.pem"
	eg.stack = startedStack(t)
	eg.gw = startGatewayOn(t, eg.stack, func(c *gateway.Config) {
		eg.local = c.Runners[0].(*runner.Local)
		eg.keys = c.Auth
		eg.startEdge(t)
	})
	return eg
}

func (eg *edgeGateway) startEdge(t *testing.T) {
	t.Helper()
	e, err := stack.StartEdge(eg.local.R, stack.EdgeConfig{Listen: "127.0.0.1:0", RunnerID: eg.local.ID(),
		BaseDomain: endpointDomain, CA: eg.ca, Authorize: stack.KeyAuthorizer(eg.keys), DialMark: eg.stack.EdgeDialMark()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	eg.edge = e
	eg.local.EdgeDomain, eg.local.EdgePort = endpointDomain, e.Port()
}

// client reaches the edge for any *.sandboxd.localhost name, trusting the platform CA
// (or roots when given), as `curl --resolve` would.
func (eg *edgeGateway) client(roots *x509.CertPool) *http.Client {
	if roots == nil {
		roots = eg.ca.Pool()
	}
	addr := eg.edge.Addr.String()
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
}

// workloadCert is a CA of the workload's own and a server certificate for host, PEM.
func workloadCert(t *testing.T, host string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, leafKey := key(), key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "workload CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// TestEndpoints publishes a Python workload's ports through the edge: HTTPS (OPEN and
// TOKEN) to an HTTP server with events and WebSockets, and TLS passthrough to a server
// holding its own certificate; checks the addresses in the status, their stability,
// and that they are gone with the sandbox.
func TestEndpoints(t *testing.T) {
	eg := startEdgeGateway(t)
	top := t
	ctx := context.Background()
	script, err := os.ReadFile("testdata/endpoints.py")
	if err != nil {
		t.Fatal(err)
	}
	public := sandboxv1.Visibility_VISIBILITY_PUBLIC
	https := func(auth sandboxv1.EndpointAuth) *sandboxv1.EndpointSpec {
		return &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, Auth: auth}
	}
	// The passthrough name is known before the sandbox exists only once it has an ID:
	// the workload's certificate names the wildcard of this runner's endpoints.
	caPEM, certPEM, keyPEM := workloadCert(t, "*.local."+endpointDomain)
	sp := spec(python(), "python3", "/app/endpoints.py")
	sp.Containers[0].Files = []*sandboxv1.FileMount{{Path: "/app/endpoints.py", Content: script},
		{Path: "/certs/server.pem", Content: certPEM}, {Path: "/certs/server-key.pem", Content: keyPEM}}
	sp.Services = []*sandboxv1.Service{
		{Port: 8080, Name: "web", Visibility: public, Endpoint: https(sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN)},
		{Port: 8443, Name: "tls", Visibility: public, Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH}},
	}
	sb := eg.create(t, sp, "")
	id := sb.SandboxId
	webHost := edge.Host(8080, id, "local", endpointDomain)
	tlsHost := edge.Host(8443, id, "local", endpointDomain)
	port := eg.edge.Port()

	// The passthrough address is in the create response; the HTTPS URL once it runs.
	st := sb.GetStatus().GetServices()
	if len(st) != 2 || st[1].GetUrl() != net.JoinHostPort(tlsHost, itoa(port)) || st[0].GetEndpoint().GetUrl() != "" {
		t.Fatalf("services at create: %v", st)
	}
	running := eg.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	webURL := running.GetStatus().GetServices()[0].GetEndpoint().GetUrl()
	if webURL != "https://"+webHost+":"+itoa(port) {
		t.Fatalf("HTTPS URL %q", webURL)
	}
	hc := eg.client(nil)
	get := func(url string, header ...string) (int, string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, _ := http.NewRequest("GET", url, nil)
			for i := 0; i+1 < len(header); i += 2 {
				req.Header.Set(header[i], header[i+1])
			}
			res, err := hc.Do(req)
			if err == nil {
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusBadGateway || time.Now().After(deadline) {
					return res.StatusCode, string(b)
				}
			} else if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", url, err)
			}
			time.Sleep(200 * time.Millisecond) // the server in the sandbox is starting
		}
	}

	t.Run("https open", func(t *testing.T) {
		if code, body := get(webURL + "/"); code != 200 || body != "hello from the sandbox\n" {
			t.Fatalf("GET /: %d %q", code, body)
		}
		// curl, the way a user would: --resolve to loopback, trusting the platform CA.
		if _, err := exec.LookPath("curl"); err == nil {
			out, err := exec.Command("curl", "-sS", "--cacert", eg.caFile, "--resolve", webHost+":"+itoa(port)+":127.0.0.1", webURL+"/").CombinedOutput()
			if err != nil || string(out) != "hello from the sandbox\n" {
				t.Errorf("curl: %v %s", err, out)
			}
		}
		_, body := get(webURL+"/headers", "X-Forwarded-For", "6.6.6.6")
		var h map[string]string
		if err := json.Unmarshal([]byte(body), &h); err != nil || h["x-forwarded-proto"] != "https" || h["x-forwarded-for"] != "127.0.0.1" || h["x-forwarded-host"] != webHost+":"+itoa(port) {
			t.Errorf("forwarded headers %q", body)
		}
	})

	t.Run("server-sent events", func(t *testing.T) {
		res, err := hc.Get(webURL + "/sse")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		var got []string
		t0 := time.Now()
		for sc.Scan() && len(got) < 3 {
			if line := sc.Text(); strings.HasPrefix(line, "data: ") {
				got = append(got, line)
				if len(got) == 1 && time.Since(t0) > 500*time.Millisecond {
					t.Errorf("first event after %v: buffered", time.Since(t0))
				}
			}
		}
		if strings.Join(got, ",") != "data: tick 0,data: tick 1,data: tick 2" {
			t.Errorf("events %v", got)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		wsClient := eg.client(nil)
		wsClient.Transport.(*http.Transport).ForceAttemptHTTP2 = false
		c, _, err := websocket.Dial(ctx, "wss://"+webHost+":"+itoa(port)+"/ws", &websocket.DialOptions{HTTPClient: wsClient}) //nolint:bodyclose // the upgraded connection is c
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		for _, msg := range []string{"one", "two"} {
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			_, got, err := c.Read(ctx)
			if err != nil || string(got) != "echo: "+msg {
				t.Fatalf("read %q %v", got, err)
			}
		}
		_ = c.Close(websocket.StatusNormalClosure, "")
	})

	t.Run("tls passthrough", func(t *testing.T) {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caPEM)
		var line string
		deadline := time.Now().Add(30 * time.Second)
		for {
			conn, err := tls.Dial("tcp", eg.edge.Addr.String(), &tls.Config{ServerName: tlsHost, RootCAs: roots})
			if err == nil {
				line, err = bufio.NewReader(conn).ReadString('\n')
				conn.Close()
				if err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("passthrough: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if line != "sni:"+tlsHost+"\n" {
			t.Errorf("the workload saw %q, want its endpoint name as SNI", line)
		}
		// Python's ssl module, as the example: the workload's own CA verifies.
		caFile := t.TempDir() + "/workload-ca.pem"
		if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		py := `import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[1])
with socket.create_connection(("127.0.0.1", int(sys.argv[3]))) as s, ctx.wrap_socket(s, server_hostname=sys.argv[2]) as t:
    print(t.recv(200).decode().strip(), t.getpeercert()["subject"][0][0][1])`
		out, err := exec.Command("python3", "-c", py, caFile, tlsHost, itoa(port)).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "sni:"+tlsHost+" *.local."+endpointDomain {
			t.Errorf("python ssl through passthrough: %v %s", err, out)
		}
	})

	t.Run("unknown names look alike", func(t *testing.T) {
		_, none := get("https://8080-aaaaaaaaaaaaaaaa.local." + endpointDomain + ":" + itoa(port) + "/")
		code, noPort := get("https://9999-" + id + ".local." + endpointDomain + ":" + itoa(port) + "/")
		if code != 404 || none != noPort {
			t.Errorf("unknown sandbox %q vs unpublished port of a real one %d %q", none, code, noPort)
		}
	})

	t.Run("main command restart and edge restart keep the address", func(t *testing.T) {
		if _, err := eg.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", "kill $(pgrep -f endpoints.py)"}})); err != nil {
			t.Fatal(err)
		}
		eg.edge.Close()
		eg.startEdge(top) // lives on after this subtest
		port = eg.edge.Port()
		hc = eg.client(nil)
		webURL = "https://" + webHost + ":" + itoa(port)
		if code, body := get(webURL + "/"); code != 200 || body != "hello from the sandbox\n" {
			t.Errorf("after restarts: %d %q", code, body)
		}
	})

	t.Run("gone after delete", func(t *testing.T) {
		if _, err := eg.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
		eg.waitState(t, id, sandboxv1.State_STATE_TERMINATED)
		if code, _ := get(webURL + "/"); code != 404 {
			t.Errorf("after delete: %d", code)
		}
	})
}

// TestEndpointTokenAuth: a TOKEN endpoint wants an API key of the sandbox's organization
// and never passes it on to the sandbox.
func TestEndpointTokenAuth(t *testing.T) {
	eg := startEdgeGateway(t)
	script, err := os.ReadFile("testdata/endpoints.py")
	if err != nil {
		t.Fatal(err)
	}
	_, certPEM, keyPEM := workloadCert(t, "unused")
	sp := spec(python(), "python3", "/app/endpoints.py")
	sp.Containers[0].Files = []*sandboxv1.FileMount{{Path: "/app/endpoints.py", Content: script},
		{Path: "/certs/server.pem", Content: certPEM}, {Path: "/certs/server-key.pem", Content: keyPEM}}
	sp.Services = []*sandboxv1.Service{{Port: 8080, Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC,
		Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN, RequestTimeoutSeconds: 30}}}
	sb := eg.create(t, sp, "")
	url := eg.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING).GetStatus().GetServices()[0].GetEndpoint().GetUrl()
	if url == "" {
		t.Fatal("no URL")
	}
	hc := eg.client(nil)
	do := func(key string) (int, string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, _ := http.NewRequest("GET", url+"/headers", nil)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			res, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusBadGateway || time.Now().After(deadline) {
				return res.StatusCode, string(b)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if code, _ := do(""); code != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", code)
	}
	if code, _ := do("sbx_0000000000000000_not-a-key"); code != http.StatusUnauthorized {
		t.Errorf("invalid key: %d, want 401", code)
	}
	if code, _ := do(eg.keyB); code != http.StatusForbidden {
		t.Errorf("a key of another organization: %d, want 403", code)
	}
	code, body := do(eg.keyA)
	if code != 200 || strings.Contains(strings.ToLower(body), "authorization") || strings.Contains(body, eg.keyA) {
		t.Errorf("own key: %d %s (the key must not reach the sandbox)", code, body)
	}
}

// TestEndpointValidation: each rule of a service is refused with its field.
func TestEndpointValidation(t *testing.T) {
	eg := startEdgeGateway(t)
	public := sandboxv1.Visibility_VISIBILITY_PUBLIC
	for _, tc := range []struct {
		name    string
		service *sandboxv1.Service
		field   string
	}{
		{"port 0", &sandboxv1.Service{Port: 0}, "sandbox.spec.services[0].port"},
		{"bad name", &sandboxv1.Service{Port: 80, Name: "Web_UI"}, "sandbox.spec.services[0].name"},
		{"public without endpoint", &sandboxv1.Service{Port: 80, Visibility: public}, "sandbox.spec.services[0].endpoint"},
		{"endpoint not public", &sandboxv1.Service{Port: 80, Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS}}, "sandbox.spec.services[0].visibility"},
		{"UDP endpoint", &sandboxv1.Service{Port: 80, Visibility: public, Protocol: sandboxv1.ServiceProtocol_SERVICE_PROTOCOL_UDP,
			Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS}}, "sandbox.spec.services[0].protocol"},
		{"passthrough with token", &sandboxv1.Service{Port: 80, Visibility: public,
			Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN}}, "sandbox.spec.services[0].endpoint.auth"},
		{"timeout too long", &sandboxv1.Service{Port: 80, Visibility: public,
			Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, RequestTimeoutSeconds: 901}}, "sandbox.spec.services[0].endpoint.request_timeout_seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := spec(busybox(), "true")
			sp.Services = []*sandboxv1.Service{tc.service}
			_, err := eg.sandboxes.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("create: %v, want INVALID_ARGUMENT", err)
			}
			found := false
			for _, v := range apierr.Violations(err) {
				found = found || v.Field == tc.field
			}
			if !found {
				t.Errorf("violations %v lack %s", apierr.Violations(err), tc.field)
			}
		})
	}
	// Six services: above the platform's five.
	sp := spec(busybox(), "true")
	for p := range 6 {
		sp.Services = append(sp.Services, &sandboxv1.Service{Port: int32(9000 + p)})
	}
	_, err := eg.sandboxes.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "sandbox.spec.services" {
		t.Errorf("six services: %v %v", err, vs)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestSbxPublish: `sbx run --publish` prints the endpoint, `sbx get` lists it, and it
// serves what the main command serves.
func TestSbxPublish(t *testing.T) {
	eg := startEdgeGateway(t)
	out, errs, code := sbx(eg.gw, "", "run", "--publish", "8080:https", "--main", "cd /etc && exec python3 -m http.server 8080", python())
	if code != 0 {
		t.Fatalf("sbx run: %d %s", code, errs)
	}
	id := strings.TrimSpace(out)
	url := "https://" + edge.Host(8080, id, "local", endpointDomain) + ":" + itoa(eg.edge.Port())
	if !strings.Contains(errs, "8080/https\t"+url) {
		t.Errorf("sbx run printed %q, want the endpoint %s", errs, url)
	}
	if out, _, _ := sbx(eg.gw, "", "get", id); !strings.Contains(out, "Endpoints:") || !strings.Contains(out, url) {
		t.Errorf("sbx get: %s", out)
	}
	if _, errs, code := sbx(eg.gw, "", "run", "--publish", "8080:ftp", python()); code == 0 || !strings.Contains(errs, "unknown endpoint kind") {
		t.Errorf("--publish 8080:ftp: %d %s", code, errs)
	}
	hc := eg.client(nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := hc.Get(url + "/hostname")
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == 200 && string(b) == id+"\n" {
				return
			}
			err = fmt.Errorf("%d %q", res.StatusCode, b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s/hostname: %v", url, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPrivateServices: a PRIVATE port is reachable from the sandboxes of its
// organization, at the address in its status, and from nothing else; ports it did not
// declare stay closed to them too.
func TestPrivateServices(t *testing.T) {
	g := startGateway(t)
	ctx := context.Background()
	srv := spec(busybox(), "/bin/sh", "-c", `echo private > /www/index.html; httpd -p 8080 -h /www; httpd -f -p 9090 -h /www`)
	srv.Containers[0].Files = []*sandboxv1.FileMount{{Path: "/www/.keep", Content: []byte{}}}
	srv.Services = []*sandboxv1.Service{{Port: 8080, Name: "api", Visibility: sandboxv1.Visibility_VISIBILITY_PRIVATE}}
	server := g.waitState(t, g.create(t, srv, "").SandboxId, sandboxv1.State_STATE_RUNNING)
	target := server.GetStatus().GetServices()[0].GetUrl()
	if _, _, err := net.SplitHostPort(target); err != nil {
		t.Fatalf("private service url %q", target)
	}
	host, _, _ := net.SplitHostPort(target)
	peer := g.waitState(t, g.create(t, sleeperSpec(), "").SandboxId, sandboxv1.State_STATE_RUNNING)
	res, err := g.other.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sleeperSpec()}}))
	if err != nil {
		t.Fatal(err)
	}
	stranger := res.Msg.GetSandboxId()
	// fetch asks addr for / from inside sandbox from (busybox nc: the static wget
	// crashes); "" when nothing answered.
	fetch := func(c sandboxv1connect.SandboxServiceClient, from, addr string, tries int) string {
		t.Helper()
		host, port, _ := net.SplitHostPort(addr)
		script := `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 ` + host + " " + port
		var out string
		for range tries { // the server in the sandbox may still be starting
			r, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: from, Command: []string{"sh", "-c", script}}))
			if err != nil {
				t.Fatal(err)
			}
			if out = string(r.Msg.GetStdout()); out != "" {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		return out
	}
	if out := fetch(g.sandboxes, peer.SandboxId, target, 10); !strings.HasSuffix(out, "\r\n\r\nprivate\n") {
		t.Errorf("same organization, private port: %q", out)
	}
	if out := fetch(g.sandboxes, peer.SandboxId, net.JoinHostPort(host, "9090"), 1); out != "" {
		t.Errorf("same organization reached a port the server did not declare: %q", out)
	}
	if out := fetch(g.other, stranger, target, 1); out != "" {
		t.Errorf("another organization reached the private port: %q", out)
	}
}

// hostDial connects from the host to addr (a sandbox's ip:port) with socket mark mark (0:
// none); the line the sandbox's httpd answers "GET /" with, or the error.
func hostDial(addr string, mark uint32) (string, error) {
	d := net.Dialer{Timeout: 3 * time.Second, Control: sockmark.Control(mark)}
	c, err := d.Dial("tcp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return body, err
}

// TestHostReachesOnlyEndpoints: of a running sandbox, the host reaches only what the edge
// publishes, and only through the edge: its published port, a PRIVATE one and one it
// never declared all refuse a plain connection from the host (at once: a reset), while
// the HTTPS endpoint answers through the edge. Control: with the network's host mark,
// the edge's, the same dials get the servers, so the refusals are the guard's.
func TestHostReachesOnlyEndpoints(t *testing.T) {
	eg := startEdgeGateway(t)
	sp := spec(busybox(), "/bin/sh", "-c", `httpd -p 7070 -h /www && httpd -p 9090 -h /www && exec httpd -f -p 8080 -h /www`)
	sp.Containers[0].Files = []*sandboxv1.FileMount{{Path: "/www/index.html", Content: []byte("sandbox\n")}}
	sp.Services = []*sandboxv1.Service{
		{Port: 8080, Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC, Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN}},
		{Port: 7070, Visibility: sandboxv1.Visibility_VISIBILITY_PRIVATE},
	}
	running := eg.waitState(t, eg.create(t, sp, "").SandboxId, sandboxv1.State_STATE_RUNNING)
	svcs := running.GetStatus().GetServices()
	url := svcs[0].GetEndpoint().GetUrl()
	ip, _, err := net.SplitHostPort(svcs[1].GetUrl()) // the PRIVATE service's address
	if url == "" || err != nil {
		t.Fatalf("services: %v", svcs)
	}
	hc := eg.client(nil)
	var body string
	for deadline := time.Now().Add(30 * time.Second); body == "" && time.Now().Before(deadline); {
		if res, err := hc.Get(url + "/"); err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				body = string(b)
				break
			}
		}
		time.Sleep(100 * time.Millisecond) // httpd is starting
	}
	if body != "sandbox\n" {
		t.Fatalf("HTTPS endpoint through the edge: %q", body)
	}
	mark := eg.stack.EdgeDialMark()
	for _, c := range []struct {
		port string
		mark uint32
		ok   bool
	}{
		{"8080", 0, false}, // published, but only through the edge
		{"7070", 0, false}, // PRIVATE: its organization's sandboxes only
		{"9090", 0, false}, // never declared
		{"8080", mark, true},
		{"7070", mark, true},
		{"9090", mark, true},
	} {
		t0 := time.Now()
		got, err := hostDial(net.JoinHostPort(ip, c.port), c.mark)
		switch {
		case c.ok && (err != nil || got != "sandbox\n"):
			t.Errorf("host with the mark -> %s: %q %v", c.port, got, err)
		case !c.ok && err == nil:
			t.Errorf("host -> %s: reached the sandbox: %q", c.port, got)
		case !c.ok && (!errors.Is(err, syscall.ECONNREFUSED) || time.Since(t0) > time.Second):
			t.Errorf("host -> %s: %v after %v, want connection refused at once", c.port, err, time.Since(t0))
		}
	}
}
