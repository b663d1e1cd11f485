package apifront

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
)

type keys map[string]auth.Principal

func (k keys) Authenticate(key string) (auth.Principal, error) {
	p, ok := k[key]
	if !ok {
		return auth.Principal{}, auth.ErrInvalidKey
	}
	return p, nil
}

// trap is a body that fails the test when read.
type trap struct{ reads atomic.Int32 }

func (t *trap) Read([]byte) (int, error) { t.reads.Add(1); return 0, errors.New("read") }
func (t *trap) Close() error             { return nil }

func TestUnauthenticatedBodyIsNeverRead(t *testing.T) {
	var served atomic.Int32
	f := New(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }), Config{Auth: keys{"good": {Org: "o"}}, Public: []string{"GET /readyz"}})
	for _, tc := range []struct {
		name, path, ct, auth string
		status               int
		grpcStatus           string
	}{
		{"rest no key", "/v1/sandboxes", "application/json", "", 401, ""},
		{"rest bad key", "/v1/sandboxes", "application/json", "Bearer bad", 401, ""},
		{"connect", "/coreweave.sandbox.v1.SandboxService/CreateSandbox", "application/json", "", 401, ""},
		{"connect proto", "/coreweave.sandbox.v1.SandboxService/CreateSandbox", "application/proto", "Basic x", 401, ""},
		{"grpc", "/coreweave.sandbox.v1.SandboxService/CreateSandbox", "application/grpc", "", 200, "16"},
		{"grpc-web", "/coreweave.sandbox.v1.SandboxService/CreateSandbox", "application/grpc-web+proto", "", 200, "16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &trap{}
			req := httptest.NewRequest("POST", tc.path, nil)
			req.Body, req.ContentLength = body, 100_000_000
			req.Header.Set("Content-Type", tc.ct)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			f.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Errorf("HTTP %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.grpcStatus != "" {
				if got := rec.Header().Get("Grpc-Status"); got != tc.grpcStatus {
					t.Errorf("grpc-status %q, want %q", got, tc.grpcStatus)
				}
				if r := grpcReason(t, rec.Header().Get("Grpc-Status-Details-Bin")); r != apierr.Unauthenticated {
					t.Errorf("grpc-status-details-bin reason %q, want %s", r, apierr.Unauthenticated)
				}
			} else if !strings.Contains(rec.Body.String(), apierr.Unauthenticated) {
				t.Errorf("no %s in %s", apierr.Unauthenticated, rec.Body)
			}
			if rec.Header().Get("Connection") != "close" {
				t.Error("the connection of a refused HTTP/1 upload is kept open")
			}
			if n := body.reads.Load(); n != 0 {
				t.Errorf("body read %d times before authentication", n)
			}
		})
	}
	if served.Load() != 0 {
		t.Errorf("next served %d unauthenticated requests", served.Load())
	}
	f.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/readyz", nil))
	if served.Load() != 1 {
		t.Error("public path not served without a key")
	}
}

func TestAuthenticatedPrincipalReachesTheInterceptor(t *testing.T) {
	var got auth.Principal
	h := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		// No authenticator: it must not be asked again.
		ctx, err := auth.Interceptor{Auth: keys{}}.Authorize(r.Context(), r.Header)
		if err != nil {
			t.Errorf("Authorize: %v", err)
			return
		}
		got, _ = auth.FromContext(ctx)
	})
	f := New(h, Config{Auth: keys{"good": {Org: "o", KeyID: "k"}}})
	req := httptest.NewRequest("GET", "/v1/sandboxes", nil)
	req.Header.Set("Authorization", "bearer good") // RFC 9110: the scheme is case-insensitive
	rec := httptest.NewRecorder()
	f.ServeHTTP(rec, req)
	if rec.Code != 200 || got.Org != "o" || got.KeyID != "k" {
		t.Fatalf("HTTP %d, principal %+v", rec.Code, got)
	}
}

func envelope(n int) []byte {
	b := make([]byte, 5+n)
	binary.BigEndian.PutUint32(b[1:5], uint32(n))
	return b
}

func TestBodyBudget(t *testing.T) {
	read := func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			w.Header().Set("X-Err", apierr.Reason(err)+" "+connect.CodeOf(err).String())
		}
	}
	f := New(http.HandlerFunc(read), Config{Auth: keys{"k": {}}, MaxBodyBytesInFlight: 1000})
	do := func(ct string, body []byte, knownLen bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/coreweave.sandbox.v1.SandboxService/WriteFile", bytes.NewReader(body))
		if !knownLen {
			req.ContentLength = -1
		}
		req.Header.Set("Content-Type", ct)
		req.Header.Set("Authorization", "Bearer k")
		rec := httptest.NewRecorder()
		f.ServeHTTP(rec, req)
		return rec
	}
	// Known size larger than what is left of the budget: refused before it is read.
	f.budget.TryAcquire(600) // bodies of other requests
	if rec := do("application/proto", make([]byte, 600), true); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), apierr.ServerBusy) {
		t.Errorf("unary beyond the budget left: HTTP %d %s", rec.Code, rec.Body)
	}
	f.budget.Release(600)
	if rec := do("application/proto", make([]byte, 600), true); rec.Code != http.StatusOK || rec.Header().Get("X-Err") != "" {
		t.Errorf("unary within the budget: HTTP %d %q", rec.Code, rec.Header().Get("X-Err"))
	}
	// Unknown size: refused when the reads pass the budget.
	if rec := do("application/proto", make([]byte, 2000), false); !strings.Contains(rec.Header().Get("X-Err"), apierr.ServerBusy) {
		t.Errorf("oversized chunked unary: %q", rec.Header().Get("X-Err"))
	}
	// A stream of many messages, each within the budget, passes: each message gives back
	// the previous one's budget.
	var stream []byte
	for range 10 {
		stream = append(stream, envelope(600)...)
	}
	if rec := do("application/grpc", stream, false); rec.Header().Get("X-Err") != "" {
		t.Errorf("stream of small messages: %q", rec.Header().Get("X-Err"))
	}
	if rec := do("application/grpc", envelope(1500), false); !strings.Contains(rec.Header().Get("X-Err"), "resource_exhausted") {
		t.Errorf("message larger than the budget: %q", rec.Header().Get("X-Err"))
	}
	// Everything was given back.
	if !f.budget.TryAcquire(1000) {
		t.Error("budget leaked")
	}
}

func TestPathVars(t *testing.T) {
	var svcs = sandboxv1.File_coreweave_sandbox_v1_sandbox_proto.Services()
	routes, err := Routes(svcs.Get(0))
	if err != nil || len(routes) == 0 {
		t.Fatalf("Routes: %d %v", len(routes), err)
	}
	routes = sortRoutes(routes)
	for _, tc := range []struct {
		method, path string
		want         map[string]string
	}{
		{"GET", "/v1/sandboxes/abc", map[string]string{"sandbox_id": "abc"}},
		{"DELETE", "/v1/sandboxes/abc", map[string]string{"sandbox_id": "abc"}},
		{"POST", "/v1/sandboxes/abc:exec", map[string]string{"sandbox_id": "abc"}},
		{"GET", "/v1/sandboxes/abc:readFile", map[string]string{"sandbox_id": "abc"}},
		{"GET", "/v1/sandboxes", nil},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		rt, got := match(routes, tc.method, req)
		if rt == nil || len(got) != len(tc.want) || got["sandbox_id"] != tc.want["sandbox_id"] {
			t.Errorf("%s %s: vars %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
	ctx := t.Context()
	ctx = contextWithVars(ctx, map[string]string{"sandbox_id": "abc"})
	if err := checkVars(ctx, &sandboxv1.GetSandboxRequest{SandboxId: "abc"}); err != nil {
		t.Errorf("matching message refused: %v", err)
	}
	err = checkVars(ctx, &sandboxv1.GetSandboxRequest{SandboxId: "other"})
	if connect.CodeOf(err) != connect.CodeInvalidArgument || len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != "sandbox_id" {
		t.Errorf("override: %v %v", err, apierr.Violations(err))
	}
}

func TestStrictJSON(t *testing.T) {
	c := strictJSON{vanguard.NewJSONCodec(protoregistry.GlobalTypes)}
	c.UnmarshalOptions.DiscardUnknown = false
	for name, body := range map[string]string{
		"invalid UTF-8": "{\"tags\":[\"\xff\"]}",
		"unknown field": `{"tags":["a"],"nope":1}`,
		"not JSON":      `{`,
	} {
		err := c.Unmarshal([]byte(body), &sandboxv1.PurgeSandboxesRequest{})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
			t.Errorf("%s: %v (%s), want INVALID_ARGUMENT %s", name, err, apierr.Reason(err), apierr.InvalidRequest)
		}
	}
	var m sandboxv1.PurgeSandboxesRequest
	if err := c.Unmarshal([]byte(`{"tags":["a"]}`), &m); err != nil || len(m.GetTags()) != 1 {
		t.Errorf("valid body: %v %v", &m, err)
	}
}

func TestUnknownEnums(t *testing.T) {
	if err := checkEnums(&sandboxv1.ListSandboxesRequest{State: sandboxv1.State_STATE_RUNNING}); err != nil {
		t.Errorf("known value refused: %v", err)
	}
	err := checkEnums(&sandboxv1.ListSandboxesRequest{State: 99, SortDirection: 7})
	vs := apierr.Violations(err)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || len(vs) != 2 || vs[0].Field != "state" || vs[1].Field != "sort_direction" {
		t.Errorf("unknown values: %v %v", err, vs)
	}
	// Nested and repeated fields too.
	err = checkEnums(&sandboxv1.ConnectSandboxRequest{RequestedPermissions: []sandboxv1.SandboxDataPermission{1, 77}})
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "requested_permissions[1]" {
		t.Errorf("repeated: %v %v", err, vs)
	}
}

// grpcReason decodes grpc-status-details-bin and returns its ErrorInfo's reason.
func grpcReason(t *testing.T, bin string) string {
	t.Helper()
	b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(bin, "="))
	if err != nil {
		t.Fatalf("grpc-status-details-bin %q: %v", bin, err)
	}
	var st status.Status
	if err := proto.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	for _, d := range st.GetDetails() {
		var info errdetails.ErrorInfo
		if d.UnmarshalTo(&info) == nil && info.GetDomain() == apierr.Domain {
			return info.GetReason()
		}
	}
	return ""
}

// TestSlowAuthenticatedBodyTimesOut: an authenticated body that stops arriving is cut off
// after BodyReadTimeout, except on client-streaming paths; a complete body clears the
// deadline, so the handler may then run (stream a response) as long as it likes.
func TestSlowAuthenticatedBodyTimesOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	results := make(chan error, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		if err == nil && r.URL.Path == "/x.S/Unary" {
			time.Sleep(2 * timeout) // past the deadline, after the body
			_, err = w.Write([]byte("late"))
		}
		results <- err
	})
	srv := httptest.NewServer(New(h, Config{Auth: keys{"k": {}}, BodyReadTimeout: timeout, ClientStreaming: []string{"/x.S/Bidi"}}))
	defer srv.Close()
	send := func(path string, complete bool) (time.Duration, error) {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		body := "abc"
		if !complete {
			body = "a" // of 3
		}
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/proto\r\nContent-Length: 3\r\n\r\n"+body)
		select {
		case err := <-results:
			return time.Since(start), err
		case <-time.After(5 * timeout):
			return time.Since(start), errors.New("still reading")
		}
	}
	if took, err := send("/x.S/Slow", false); err == nil || took > 3*timeout {
		t.Errorf("slow body: %v after %v, want a read error after about %v", err, took, timeout)
	}
	if _, err := send("/x.S/Bidi", false); err == nil || err.Error() != "still reading" {
		t.Errorf("client stream: %v, want it still reading", err)
	}
	<-results // the client stream's handler, once its client went away
	if _, err := send("/x.S/Unary", true); err != nil {
		t.Errorf("complete body, slow handler: %v", err)
	}
}

// TestBodyDeadlineOverH2C: over HTTP/2 too, a body that stops arriving is cut off and a
// complete one leaves the call (a long response stream) alone.
func TestBodyDeadlineOverH2C(t *testing.T) {
	const timeout = 300 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusRequestTimeout)
			return
		}
		for range 4 { // a stream of responses outliving the deadline
			time.Sleep(timeout / 2)
			_, _ = w.Write([]byte("x"))
			http.NewResponseController(w).Flush()
		}
	})
	srv := httptest.NewUnstartedServer(New(h, Config{Auth: keys{"k": {}}, BodyReadTimeout: timeout}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: p}}
	post := func(body io.Reader) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/x.S/M", body)
		req.Header.Set("Authorization", "Bearer k")
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, b := post(strings.NewReader("abc")); code != 200 || b != "xxxx" {
		t.Errorf("complete body: %d %q, want 200 xxxx", code, b)
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write([]byte("a")) }()
	start := time.Now()
	if code, _ := post(pr); code != http.StatusRequestTimeout || time.Since(start) > 3*timeout {
		t.Errorf("stalled body: %d after %v, want cut off after about %v", code, time.Since(start), timeout)
	}
}

// TestUnknownFieldPaths: every unknown field of a JSON body is named by its path (proto
// names, list indexes, map keys), in messages, lists and maps of messages; the free-form
// keys of maps of scalars and of well-known types (Struct) are not fields.
func TestUnknownFieldPaths(t *testing.T) {
	c := strictJSON{vanguard.NewJSONCodec(protoregistry.GlobalTypes)}
	c.UnmarshalOptions.DiscardUnknown = false
	for _, tc := range []struct {
		msg  proto.Message
		body string
		want []string
	}{
		{&sandboxv1.CreateSandboxRequest{}, `{"sandbox":{"spec":{"annotations":{"anything":"x"},"tags":["a"],"maxLifetimeSecnds":1}}}`,
			[]string{"sandbox.spec.maxLifetimeSecnds"}},
		{&sandboxv1.CreateSandboxRequest{}, `{"sandbox":{"spec":{"containers":[{"image":"a"},{"image":"b","resources":{"limits":{"cpu":"1"}}}]}},"x":[{}]}`,
			[]string{"sandbox.spec.containers[1].resources.limits", "x"}},
		{&sandboxv1.CreateSandboxFromFileRequest{}, `{"build_context_objects":{"web":{"nope":1}},"imageOverrides":{"x":"y"}}`,
			[]string{`build_context_objects["web"].nope`}},
		{&sandboxv1.CreateSandboxTemplateRequest{}, `{"sandboxTemplate":{"attachments":{"free":{"form":[1]}},"spec":null,"displayName":"x","extra":[{"a":{}}]}}`,
			[]string{"sandbox_template.extra"}},
	} {
		err := c.Unmarshal([]byte(tc.body), tc.msg)
		var got []string
		for _, v := range apierr.Violations(err) {
			got = append(got, v.Field)
		}
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, violations %q, want %q", tc.body, err, got, tc.want)
		}
	}
	// A caller's key is echoed clipped, however long.
	long := strings.Repeat("k", 1<<20)
	err := c.Unmarshal([]byte(`{"`+long+`":1}`), &sandboxv1.PurgeSandboxesRequest{})
	if vs := apierr.Violations(err); len(vs) != 1 || len(vs[0].Field) > 200 || len(err.Error()) > 1000 {
		t.Errorf("a 1 MiB key is echoed at length %d (%d violations)", len(err.Error()), len(vs))
	}
}

// TestRESTErrorsCarryErrorInfo: an INVALID_ARGUMENT the transcoder writes itself (a query
// value of the wrong type) gets the ErrorInfo every error of the API has.
func TestRESTErrorsCarryErrorInfo(t *testing.T) {
	c := strictJSON{vanguard.NewJSONCodec(protoregistry.GlobalTypes)}
	b, err := c.MarshalAppend(nil, &status.Status{Code: int32(connect.CodeInvalidArgument), Message: `invalid parameter "page_size"`})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), apierr.InvalidRequest) || !strings.Contains(string(b), apierr.Domain) {
		t.Errorf("no ErrorInfo: %s", b)
	}
	// One of ours already has it: left alone.
	st := &status.Status{Code: int32(connect.CodeInvalidArgument)}
	info, _ := anypb.New(&errdetails.ErrorInfo{Reason: apierr.PlacementRejected, Domain: apierr.Domain})
	st.Details = append(st.Details, info)
	if b, _ := c.MarshalAppend(nil, st); strings.Count(string(b), apierr.Domain) != 1 || !strings.Contains(string(b), apierr.PlacementRejected) {
		t.Errorf("ErrorInfo changed: %s", b)
	}
}

// TestRESTInvalidUTF8 (test/security TestAPIInvalidUTF8InPathAndQuery end to end): a
// percent-encoded byte that is not UTF-8 in a path variable or query value is
// INVALID_ARGUMENT naming it; one in an unknown path or parameter keeps the error's
// details (quoted as U+FFFD).
func TestRESTInvalidUTF8(t *testing.T) {
	routes, err := Routes(sandboxv1.File_coreweave_sandbox_v1_sandbox_proto.Services().ByName("SandboxService"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, target, field string }{
		{"GET", "/v1/sandboxes/sbx-%FF", "sandbox_id"},
		{"GET", "/v1/sandboxes?tags=a&tags=%C3%28", "tags"},
		{"GET", "/v1/sandboxes?%FF=1", "\uFFFD"},
	} {
		_, _, err := routeREST(routes, httptest.NewRequest(tc.method, tc.target, nil))
		vs := apierr.Violations(err)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest || len(vs) != 1 || vs[0].Field != tc.field {
			t.Errorf("%s %s: %v %q, want INVALID_ARGUMENT on %q", tc.method, tc.target, err, vs, tc.field)
		}
	}
	_, _, err = routeREST(routes, httptest.NewRequest("GET", "/v1/no%FFroute", nil))
	if info := apierr.Info(err); info.GetReason() != apierr.RouteNotFound || info.GetMetadata()["path"] != "/v1/no\uFFFDroute" {
		t.Errorf("unknown route: %v %v", err, info)
	}
	if _, vars, err := routeREST(routes, httptest.NewRequest("GET", "/v1/sandboxes/sbx-%C3%A9", nil)); err != nil || vars["sandbox_id"] != "sbx-é" {
		t.Errorf("UTF-8 path refused: %v %v", vars, err)
	}
	if _, _, err := routeREST(routes, httptest.NewRequest("GET", "/v1/sandboxes?tags=%E2%82%AC", nil)); err != nil {
		t.Errorf("UTF-8 query refused: %v", err)
	}
}

// TestRawRoute: a RawRoute takes its body as bytes behind authentication (never read
// before), takes no query parameter, and its path is not "no route".
func TestRawRoute(t *testing.T) {
	var got []byte
	f := New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got, _ = io.ReadAll(r.Body) }),
		Config{Auth: keys{"good": {Org: "o"}}, Routes: []Route{RawRoute(http.MethodPut, "/v1/things/{name}")}})
	do := func(path, key string, body io.Reader) *httptest.ResponseRecorder {
		req := httptest.NewRequest("PUT", path, body)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		f.ServeHTTP(rec, req)
		return rec
	}
	trapBody := &trap{}
	if rec := do("/v1/things/x", "", trapBody); rec.Code != http.StatusUnauthorized || trapBody.reads.Load() != 0 {
		t.Fatalf("no key: %d, %d reads", rec.Code, trapBody.reads.Load())
	}
	if rec := do("/v1/things/x", "good", strings.NewReader("\x00raw bytes")); rec.Code != http.StatusOK || string(got) != "\x00raw bytes" {
		t.Fatalf("put: %d %q", rec.Code, got)
	}
	if rec := do("/v1/things/x?mode=1", "good", strings.NewReader("x")); rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "mode") {
		t.Fatalf("query parameter: %d %s", rec.Code, rec.Body)
	}
	if rec := do("/v1/things/x/y", "good", strings.NewReader("x")); rec.Code != http.StatusNotFound {
		t.Fatalf("another path: %d %s", rec.Code, rec.Body)
	}
}
