package security

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// rssBytes is the resident set of process pid.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// sampleRSS returns the resident set of process pid now (before) and goes on sampling it
// every interval until peak is called, which returns the largest sample (before included).
func sampleRSS(t *testing.T, pid int, every time.Duration) (before int64, peak func() int64) {
	t.Helper()
	before = rssBytes(t, pid)
	var mu sync.Mutex
	most := before
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(every):
				r := rssBytes(t, pid)
				mu.Lock()
				most = max(most, r)
				mu.Unlock()
			}
		}
	}()
	return before, func() int64 {
		close(stop)
		<-sampled
		mu.Lock()
		defer mu.Unlock()
		return most
	}
}

// zeros is an endless body that costs the client no memory.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}, Timeout: 30 * time.Second}
}

// upload sends an unauthenticated POST announcing and sending size bytes and returns the
// answer's status and gRPC status (header or trailer) and how long it took to arrive.
// HTTP/1.1 goes over a raw connection that keeps writing the body while it reads the
// answer, as a real flood does (Go's client gives up on a write error instead).
func upload(d *Dev, h2 bool, path, ct string, size int64) (status int, grpcStatus string, took time.Duration, err error) {
	start := time.Now()
	if h2 {
		req, _ := http.NewRequest("POST", d.API+path, io.LimitReader(zeros{}, size))
		req.ContentLength = size
		req.Header.Set("Content-Type", ct)
		resp, err := h2cClient().Do(req)
		if err != nil {
			return 0, "", 0, err
		}
		took = time.Since(start)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		gs := resp.Header.Get("Grpc-Status")
		if gs == "" {
			gs = resp.Trailer.Get("Grpc-Status")
		}
		return resp.StatusCode, gs, took, nil
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(d.API, "http://"))
	if err != nil {
		return 0, "", 0, err
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: api\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", path, ct, size); err != nil {
		return 0, "", 0, err
	}
	go func() { _, _ = io.Copy(c, io.LimitReader(zeros{}, size)) }()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", 0, err
	}
	took = time.Since(start)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Grpc-Status"), took, nil
}

// TestAPIUnauthenticatedFloodKeepsMemoryFlat: 8 concurrent unauthenticated uploads of
// 100 MiB on each protocol are refused from their headers — at once, without the body
// being read — so the server's memory stays where it was (it took 236 MiB to 2.57 GB).
func TestAPIUnauthenticatedFloodKeepsMemoryFlat(t *testing.T) {
	d := needDev(t)
	const size, parallel = 100 << 20, 8
	const bound = 64 << 20
	create := "/coreweave.sandbox.v1.SandboxService/CreateSandbox"
	protocols := []struct {
		name, path, ct string
		h2             bool
		// wantStatus is the HTTP status; wantGRPC the grpc-status ("" for none).
		wantStatus int
		wantGRPC   string
	}{
		{"REST", "/v1/sandboxes", "application/json", false, 401, ""},
		{"Connect", create, "application/json", false, 401, ""},
		{"Connect/proto over h2c", create, "application/proto", true, 401, ""},
		{"gRPC over h2c", create, "application/grpc", true, 200, "16"},
		{"gRPC-Web", create, "application/grpc-web+proto", false, 200, "16"},
	}
	time.Sleep(500 * time.Millisecond)
	before, sampled := sampleRSS(t, d.Pid(), 20*time.Millisecond)
	var mu sync.Mutex
	var slowest time.Duration
	for _, p := range protocols {
		var wg sync.WaitGroup
		for range parallel {
			wg.Go(func() {
				status, gs, took, err := upload(d, p.h2, p.path, p.ct, size)
				if err != nil {
					t.Errorf("%s: %v", p.name, err)
					return
				}
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
				if status != p.wantStatus || gs != p.wantGRPC {
					t.Errorf("%s: HTTP %d grpc-status %q, want %d %q (UNAUTHENTICATED)", p.name, status, gs, p.wantStatus, p.wantGRPC)
				}
				if took > 500*time.Millisecond {
					t.Errorf("%s: refused after %v, want at once", p.name, took)
				}
			})
		}
		wg.Wait()
	}
	peak := sampled()
	time.Sleep(200 * time.Millisecond)
	after := rssBytes(t, d.Pid())
	t.Logf("RSS before %d MiB, peak %d MiB (+%d MiB), after %d MiB; slowest 401 %v", before>>20, peak>>20, (peak-before)>>20, after>>20, slowest)
	fmt.Printf("security: unauthenticated flood %d×%d MiB on each of %d protocols: RSS before %d MiB, peak %d MiB (+%d MiB), after %d MiB; slowest refusal %v\n",
		parallel, size>>20, len(protocols), before>>20, peak>>20, (peak-before)>>20, after>>20, slowest.Round(time.Millisecond))
	if peak-before > bound {
		t.Errorf("RSS grew by %d MiB under the flood, want < %d MiB", (peak-before)>>20, bound>>20)
	}
}

// TestAPISlowUnauthenticatedBodyIsCutOff: a request whose body trickles in gets its 401
// from the headers and its connection closed, instead of being held open.
func TestAPISlowUnauthenticatedBodyIsCutOff(t *testing.T) {
	d := needDev(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(d.API, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, _ = fmt.Fprintf(c, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{")
	go func() {
		for range 30 {
			time.Sleep(200 * time.Millisecond)
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("HTTP %d, want 401", resp.StatusCode)
	}
	// The server closes the connection rather than wait for the rest of the body.
	if _, err := br.ReadByte(); err == nil {
		t.Error("the connection carries more after the 401")
	}
	took := time.Since(start)
	t.Logf("slow unauthenticated body: 401 and connection closed after %v", took)
	if took > 3*time.Second {
		t.Errorf("connection held %v, want it cut within 3 s", took)
	}
}

type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type            string `json:"@type"`
		Reason          string `json:"reason"`
		FieldViolations []struct {
			Field string `json:"field"`
		} `json:"fieldViolations"`
	} `json:"details"`
}

func (e apiError) fields() []string {
	var out []string
	for _, d := range e.Details {
		for _, v := range d.FieldViolations {
			out = append(out, v.Field)
		}
	}
	return out
}

func (e apiError) reason() string {
	for _, d := range e.Details {
		if d.Reason != "" {
			return d.Reason
		}
	}
	return ""
}

// rest calls the REST API and returns the HTTP status and body.
func rest(t *testing.T, d *Dev, method, path, authz string, body []byte) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, _ := http.NewRequest(method, d.API+path, rd)
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func wantInvalid(t *testing.T, what string, status int, body []byte, field string) {
	t.Helper()
	var e apiError
	_ = json.Unmarshal(body, &e)
	if status != http.StatusBadRequest || e.Code != int(connect.CodeInvalidArgument) || e.reason() != apierr.InvalidRequest {
		t.Errorf("%s: HTTP %d %s, want 400 INVALID_ARGUMENT %s", what, status, body, apierr.InvalidRequest)
		return
	}
	if field != "" && !strings.Contains(strings.Join(e.fields(), " "), field) {
		t.Errorf("%s: field violations %v, want %s", what, e.fields(), field)
	}
}

// sandboxOf creates a sleeping busybox sandbox with key and waits until it runs.
func sandboxOf(t *testing.T, d *Dev, key string) string {
	t.Helper()
	st, b := rest(t, d, "POST", "/v1/sandboxes", "Bearer "+key,
		[]byte(`{"spec":{"containers":[{"name":"main","image":"busybox:latest","command":"/bin/sh","args":["-c","trap 'exit 0' TERM; sleep infinity & wait"]}]}}`))
	if st != http.StatusOK {
		t.Fatalf("create: HTTP %d %s", st, b)
	}
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := json.Unmarshal(b, &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create: %s %v", b, err)
	}
	t.Cleanup(func() { rest(t, d, "DELETE", "/v1/sandboxes/"+sb.SandboxID, "Bearer "+key, nil) })
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, b := rest(t, d, "GET", "/v1/sandboxes/"+sb.SandboxID, "Bearer "+key, nil)
		if bytes.Contains(b, []byte(`"STATE_RUNNING"`)) {
			return sb.SandboxID
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not running: %s", sb.SandboxID, b)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestAPIPathVariableCannotBeOverriddenByQuery: GET/DELETE /v1/sandboxes/X?sandboxId=V
// acted on V. Now the contradiction is INVALID_ARGUMENT on sandbox_id, and V lives on.
func TestAPIPathVariableCannotBeOverriddenByQuery(t *testing.T) {
	d := needDev(t)
	victim := sandboxOf(t, d, d.KeyA)
	authz := "Bearer " + d.KeyA
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/sbx-does-not-exist?sandboxId=" + victim},
		{"GET", "/v1/sandboxes/sbx-does-not-exist?sandbox_id=" + victim},
		{"DELETE", "/v1/sandboxes/sbx-does-not-exist?sandboxId=" + victim},
		{"GET", "/v1/sandboxes/sbx-does-not-exist:readFile?sandboxId=" + victim + "&path=/etc/hostname"},
	} {
		st, b := rest(t, d, tc.method, tc.path, authz, nil)
		wantInvalid(t, tc.method+" "+tc.path, st, b, "sandbox_id")
	}
	// A body field of a body:"*" route cannot override the path either: either refused, or
	// about the path's sandbox.
	st, b := rest(t, d, "POST", "/v1/sandboxes/sbx-does-not-exist:exec", authz, []byte(`{"sandboxId":"`+victim+`","command":["true"]}`))
	if st != http.StatusBadRequest && (st != http.StatusNotFound || !bytes.Contains(b, []byte("sbx-does-not-exist"))) {
		t.Errorf("POST :exec with sandboxId %s in the body: HTTP %d %s", victim, st, b)
	}
	if _, b := rest(t, d, "GET", "/v1/sandboxes/"+victim, authz, nil); !bytes.Contains(b, []byte(`"STATE_RUNNING"`)) {
		t.Errorf("the victim sandbox is no longer running: %s", b)
	}
	// The path alone still works, and a query naming the same sandbox is no conflict.
	if st, b := rest(t, d, "GET", "/v1/sandboxes/"+victim+"?sandboxId="+victim, authz, nil); st != http.StatusOK {
		t.Errorf("same value in path and query: HTTP %d %s", st, b)
	}
}

// TestAPILowercaseBearer: the scheme is case-insensitive (RFC 9110) on REST, Connect and
// gRPC metadata alike.
func TestAPILowercaseBearer(t *testing.T) {
	d := needDev(t)
	for _, scheme := range []string{"bearer", "BEARER", "bEaReR"} {
		if st, b := rest(t, d, "GET", "/v1/sandboxes", scheme+" "+d.KeyA, nil); st != http.StatusOK {
			t.Errorf("REST %s: HTTP %d %s", scheme, st, b)
		}
		for name, opt := range map[string]connect.ClientOption{"gRPC": connect.WithGRPC(), "Connect": connect.WithProtoJSON()} {
			c := sandboxv1connect.NewSandboxServiceClient(h2cClient(), d.API, opt)
			req := connect.NewRequest(&sandboxv1.ListSandboxesRequest{})
			req.Header().Set("Authorization", scheme+" "+d.KeyA)
			if _, err := c.ListSandboxes(t.Context(), req); err != nil {
				t.Errorf("%s %s: %v", name, scheme, err)
			}
		}
	}
}

// TestAPIInvalidUTF8InRESTBody: 400 INVALID_ARGUMENT, as on gRPC and Connect (was 500
// UNKNOWN); unknown JSON fields are errors too.
func TestAPIInvalidUTF8InRESTBody(t *testing.T) {
	d := needDev(t)
	authz := "Bearer " + d.KeyA
	st, b := rest(t, d, "POST", "/v1/sandboxes", authz, []byte("{\"spec\":{\"tags\":[\"\xff\xfe\"]}}"))
	wantInvalid(t, "invalid UTF-8", st, b, "")
	st, b = rest(t, d, "POST", "/v1/sandboxes:purge", authz, []byte("{\"tags\":[\"\xc3\x28\"]}"))
	wantInvalid(t, "invalid UTF-8 (purge)", st, b, "")
	st, b = rest(t, d, "POST", "/v1/sandboxes:purge", authz, []byte(`{"tags":["x"],"noSuchField":1}`))
	wantInvalid(t, "unknown field", st, b, "")
}

// TestAPIGarbagePageTokensAndEnums: INVALID_ARGUMENT with a field violation, not an
// empty page, on REST, Connect and gRPC.
func TestAPIGarbagePageTokensAndEnums(t *testing.T) {
	d := needDev(t)
	authz := "Bearer " + d.KeyA
	for _, tc := range []struct{ path, field string }{
		{"/v1/sandboxes?pageToken=Z2FyYmFnZQ", "page_token"},
		{"/v1/sandboxes?pageToken=%21%21%21", "page_token"},
		{"/v1/sandboxes?state=99", "state"},
		{"/v1/sandboxes?sortDirection=7", "sort_direction"},
		{"/v1/availableRunners?view=99", "view"},
		{"/v1/availableRunners?pageToken=Z2FyYmFnZQ", "page_token"},
		{"/v1/availableRunners?serviceVisibility=42", "service_visibility"},
	} {
		st, b := rest(t, d, "GET", tc.path, authz, nil)
		wantInvalid(t, tc.path, st, b, tc.field)
	}
	st, b := rest(t, d, "GET", "/v1/sandbox/apiKeys?pageToken=OTk5OTk", "Bearer "+d.Admin, nil)
	wantInvalid(t, "apiKeys past the end", st, b, "page_token")
	for name, opt := range map[string]connect.ClientOption{"gRPC": connect.WithGRPC(), "Connect": connect.WithProtoJSON()} {
		c := sandboxv1connect.NewSandboxServiceClient(h2cClient(), d.API, opt)
		for what, m := range map[string]*sandboxv1.ListSandboxesRequest{
			"page_token": {PageToken: "Z2FyYmFnZQ"},
			"state":      {State: 99},
		} {
			req := connect.NewRequest(m)
			req.Header().Set("Authorization", authz)
			_, err := c.ListSandboxes(t.Context(), req)
			vs := apierr.Violations(err)
			if connect.CodeOf(err) != connect.CodeInvalidArgument || len(vs) == 0 || vs[0].Field != what {
				t.Errorf("%s %s: %v %v, want INVALID_ARGUMENT on %s", name, what, err, vs, what)
			}
		}
	}
}

type runnersView struct {
	Runners []struct {
		RunnerID  string `json:"runnerId"`
		Resources *struct {
			RunningSandboxes int `json:"runningSandboxes"`
		} `json:"resources"`
	} `json:"runners"`
}

func runningSeenBy(t *testing.T, d *Dev, key, org string) (int, string) {
	t.Helper()
	st, b := rest(t, d, "GET", "/v1/availableRunners?view=RUNNER_VIEW_FULL", "Bearer "+key, nil)
	var v runnersView
	if st != http.StatusOK || json.Unmarshal(b, &v) != nil || len(v.Runners) == 0 || v.Runners[0].Resources == nil {
		t.Fatalf("availableRunners: HTTP %d %s", st, b)
	}
	n := v.Runners[0].Resources.RunningSandboxes
	id := v.Runners[0].RunnerID
	st, b = rest(t, d, "GET", "/v1/organizations/"+org+"/availableRunners/"+id+"?view=RUNNER_VIEW_FULL", "Bearer "+key, nil)
	var one struct {
		Resources *struct {
			RunningSandboxes int `json:"runningSandboxes"`
		} `json:"resources"`
	}
	if st != http.StatusOK || json.Unmarshal(b, &one) != nil || one.Resources == nil {
		t.Fatalf("availableRunner: HTTP %d %s", st, b)
	}
	if one.Resources.RunningSandboxes != n {
		t.Errorf("list says %d running, get says %d", n, one.Resources.RunningSandboxes)
	}
	return n, id
}

// TestAPIDiscoveryHidesOtherOrgsSandboxCount: org-b's full view of the runner counted
// org-a's running sandboxes.
func TestAPIDiscoveryHidesOtherOrgsSandboxCount(t *testing.T) {
	d := needDev(t)
	keyB, err := d.NewKey("org-b", "user") // org-b has no sandbox of this test's making
	if err != nil {
		t.Fatal(err)
	}
	baseB, _ := runningSeenBy(t, d, keyB, "org-b")
	sandboxOf(t, d, d.KeyA)
	if n, _ := runningSeenBy(t, d, d.KeyA, "org-a"); n < 1 {
		t.Errorf("org-a sees %d running sandboxes of its own, want ≥ 1", n)
	}
	if n, _ := runningSeenBy(t, d, keyB, "org-b"); n != baseB {
		t.Errorf("org-b's count went from %d to %d when org-a started a sandbox", baseB, n)
	}
}

// TestAPIRevokedKeyGetsNoDataPlaneCertificate: ConnectSandbox issues certificates to a
// key until it is revoked, not after.
func TestAPIRevokedKeyGetsNoDataPlaneCertificate(t *testing.T) {
	d := needDev(t)
	key, err := d.NewKey("org-a", "user")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	id := sandboxOf(t, d, key)
	pk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, pk)
	body := []byte(`{"csrDer":"` + base64.StdEncoding.EncodeToString(csr) + `","requestedPermissions":["SANDBOX_DATA_PERMISSION_EXEC"]}`)
	st, b := rest(t, d, "POST", "/v1/sandboxes/"+id+":connect", "Bearer "+key, body)
	var conn struct {
		Chain []byte `json:"clientCertificateChainPem"`
	}
	if st != http.StatusOK || json.Unmarshal(b, &conn) != nil || !bytes.Contains(conn.Chain, []byte("BEGIN CERTIFICATE")) {
		t.Fatalf("ConnectSandbox before revocation: HTTP %d %s", st, b)
	}
	keyID := strings.SplitN(key, "_", 3)[1]
	if st, b := rest(t, d, "POST", "/v1/sandbox/apiKeys/"+keyID+":revoke", "Bearer "+admin, []byte(`{}`)); st != http.StatusOK {
		t.Fatalf("revoke: HTTP %d %s", st, b)
	}
	st, b = rest(t, d, "POST", "/v1/sandboxes/"+id+":connect", "Bearer "+key, body)
	var e apiError
	_ = json.Unmarshal(b, &e)
	if st != http.StatusUnauthorized || e.reason() != apierr.Unauthenticated || bytes.Contains(b, []byte("clientCertificateChainPem")) {
		t.Errorf("ConnectSandbox after revocation: HTTP %d %s, want 401 %s", st, b, apierr.Unauthenticated)
	}
}

// edgeClient reaches the edge for any endpoint name, trusting the dev CA; it keeps no
// cookies and follows no redirects, so each step is seen.
func edgeClient(t *testing.T, d *Dev) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(d.DataDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("no CA in ca.pem")
	}
	return &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, d.Edge)
			}}}
}

// TestAPIRevokedKeyEndsEdgeLoginSession: a browser session made at a TOKEN endpoint's
// login page with a key ends when the key is revoked (it lasted until the cookie expired).
func TestAPIRevokedKeyEndsEdgeLoginSession(t *testing.T) {
	d := needDev(t)
	key, err := d.NewKey("org-a", "user")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	st, b := rest(t, d, "POST", "/v1/sandboxes", "Bearer "+key, []byte(`{"spec":{"containers":[{"name":"main","image":"busybox:latest",`+
		`"command":"/bin/sh","args":["-c","mkdir -p /www && echo hello > /www/index.html && exec httpd -f -p 8080 -h /www"]}],`+
		`"services":[{"port":8080,"visibility":"VISIBILITY_PUBLIC","endpoint":{"kind":"ENDPOINT_KIND_HTTPS","auth":"ENDPOINT_AUTH_SHARE_TOKEN"}}]}}`))
	if st != http.StatusOK {
		t.Fatalf("create: HTTP %d %s", st, b)
	}
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	_ = json.Unmarshal(b, &sb)
	t.Cleanup(func() { rest(t, d, "DELETE", "/v1/sandboxes/"+sb.SandboxID, "Bearer "+d.KeyA, nil) })
	var url string
	for deadline := time.Now().Add(90 * time.Second); url == ""; time.Sleep(300 * time.Millisecond) {
		_, b := rest(t, d, "GET", "/v1/sandboxes/"+sb.SandboxID, "Bearer "+key, nil)
		var got struct {
			Status struct {
				State    string `json:"state"`
				Services []struct {
					Endpoint struct {
						URL string `json:"url"`
					} `json:"endpoint"`
				} `json:"services"`
			} `json:"status"`
		}
		_ = json.Unmarshal(b, &got)
		if got.Status.State == "STATE_RUNNING" && len(got.Status.Services) > 0 {
			url = got.Status.Services[0].Endpoint.URL
		}
		if time.Now().After(deadline) {
			t.Fatalf("no endpoint URL: %s", b)
		}
	}
	hc := edgeClient(t, d)
	form := strings.NewReader("key=" + key + "&next=/")
	req, _ := http.NewRequest("POST", url+"/.sandboxd/login", form)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	var cookie *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == "__Host-sandboxd" {
			cookie = c
		}
	}
	if res.StatusCode != http.StatusSeeOther || cookie == nil {
		t.Fatalf("login: HTTP %d, cookie %v", res.StatusCode, cookie)
	}
	get := func() int {
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, _ := http.NewRequest("GET", url+"/", nil)
			req.AddCookie(cookie)
			res, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusBadGateway || time.Now().After(deadline) {
				return res.StatusCode
			}
			time.Sleep(300 * time.Millisecond) // the workload is still starting
		}
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("with the session cookie: HTTP %d, want 200", code)
	}
	keyID := strings.SplitN(key, "_", 3)[1]
	if st, b := rest(t, d, "POST", "/v1/sandbox/apiKeys/"+keyID+":revoke", "Bearer "+admin, []byte(`{}`)); st != http.StatusOK {
		t.Fatalf("revoke: HTTP %d %s", st, b)
	}
	revoked := time.Now()
	for {
		code := get()
		if code == http.StatusUnauthorized {
			t.Logf("session of the revoked key refused %v after the revocation", time.Since(revoked).Round(time.Millisecond))
			return
		}
		if time.Since(revoked) > 10*time.Second {
			t.Fatalf("session of a revoked key still answers HTTP %d %v after the revocation", code, time.Since(revoked))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
