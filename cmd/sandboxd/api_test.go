package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/gateway/gatewaytest"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// apiPort serves the API port as `sandboxd dev` assembles it (control plane and gateway
// behind the API front, HTTP/1.1 and h2c) over an idle runner, and returns its base URL
// and the admin key.
func apiPort(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	st, err := openStoreWithAdmin(t.Context(), dir, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	key, err := os.ReadFile(filepath.Join(dir, adminKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	keys := auth.NewStoreAuthenticator(st, log)
	gw, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{gatewaytest.IdleRunner{RunnerID: "r1",
		Cap: runner.Capacity{MilliCPU: 2000, MemoryBytes: 4 << 30, ConnectedAt: time.Now(), RuntimeClasses: []string{"runc"}}}}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	cp, err := newControlPlane(st, keys, log, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := newAPIServer(controlplane.Route(cp.Handler(), gw.Handler()), keys, log)
	ts := httptest.NewUnstartedServer(srv.Handler)
	ts.Config = srv
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.URL, strings.TrimSpace(string(key))
}

// h2c is a client speaking HTTP/2 without TLS, as gRPC clients do to the dev port.
func h2c() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}, Timeout: 30 * time.Second}
}

// rawCodec sends and receives messages as the bytes the test gives (*raw), so a test can
// put on the wire what a typed client would not (unknown fields, malformed JSON). Its
// name says which codec the server must use: "json" or "proto". Other messages (the
// status of a gRPC error) are decoded as such.
type rawCodec string

type raw struct{ b []byte }

func (c rawCodec) Name() string { return string(c) }
func (rawCodec) Marshal(m any) ([]byte, error) {
	return m.(*raw).b, nil
}
func (c rawCodec) Unmarshal(b []byte, m any) error {
	switch m := m.(type) {
	case *raw:
		m.b = append([]byte(nil), b...)
		return nil
	case proto.Message:
		if c == "json" {
			return protojson.Unmarshal(b, m)
		}
		return proto.Unmarshal(b, m)
	}
	return fmt.Errorf("rawCodec: cannot decode into %T", m)
}

// rpcProtocols are the RPC protocols of the API port, as connect-go client options.
var rpcProtocols = map[string]connect.ClientOption{
	"gRPC":     connect.WithGRPC(),
	"gRPC-Web": connect.WithGRPCWeb(),
	"Connect":  connect.WithClientOptions(),
}

// call makes a unary call of procedure over protocol with body encoded by codec.
func call(t *testing.T, base, key, procedure, protocol string, codec rawCodec, body string) error {
	t.Helper()
	opts := []connect.ClientOption{rpcProtocols[protocol], connect.WithCodec(codec)}
	if key != "" {
		opts = append(opts, connect.WithInterceptors(connecttest.Bearer(key)))
	}
	c := connect.NewClient[raw, raw](h2c(), base+procedure, opts...)
	_, err := c.CallUnary(t.Context(), connect.NewRequest(&raw{[]byte(body)}))
	return err
}

// restResult is a REST answer: its status, headers, and its body as google.rpc.Status
// (nil unless it is one).
type restResult struct {
	code   int
	header http.Header
	body   []byte
	status *status.Status
}

// reason is the ErrorInfo reason (domain cwsandbox.com) of the answer, or "".
func (r restResult) reason() string {
	for _, d := range r.status.GetDetails() {
		var info errdetails.ErrorInfo
		if d.UnmarshalTo(&info) == nil && info.GetDomain() == apierr.Domain {
			return info.GetReason()
		}
	}
	return ""
}

// fields are the BadRequest field violations' fields of the answer.
func (r restResult) fields() []string {
	var out []string
	for _, d := range r.status.GetDetails() {
		var br errdetails.BadRequest
		if d.UnmarshalTo(&br) == nil {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField()+": "+v.GetDescription())
			}
		}
	}
	return out
}

func rest(t *testing.T, base, key, method, path, body string) restResult {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out := restResult{code: res.StatusCode, header: res.Header}
	if out.body, err = io.ReadAll(res.Body); err != nil {
		t.Fatal(err)
	}
	var st status.Status
	if res.StatusCode >= 400 && protojson.Unmarshal(out.body, &st) == nil {
		out.status = &st
	}
	return out
}

// binding is the REST call of md's google.api.http rule with every path variable "x":
// method, path, and whether it takes a body ("" when md has no rule).
func binding(md protoreflect.MethodDescriptor) (string, string, bool) {
	rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
	if rule == nil {
		return "", "", false
	}
	var method, tmpl string
	switch p := rule.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		method, tmpl = http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		method, tmpl = http.MethodPost, p.Post
	case *annotations.HttpRule_Patch:
		method, tmpl = http.MethodPatch, p.Patch
	case *annotations.HttpRule_Put:
		method, tmpl = http.MethodPut, p.Put
	case *annotations.HttpRule_Delete:
		method, tmpl = http.MethodDelete, p.Delete
	}
	return method, pathVar.ReplaceAllString(tmpl, "x"), rule.GetBody() != ""
}

var pathVar = regexp.MustCompile(`\{[^}]*\}`)

func procedure(md protoreflect.MethodDescriptor) string {
	return "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
}

// notBuilt are the RPCs sandboxd does not build yet: SettingsService's object-storage
// WIF config (its snapshot bucket and build storage configs and secret stores are built).
// VolumeService is built (issue 23).
func notBuilt() []protoreflect.MethodDescriptor {
	var out []protoreflect.MethodDescriptor
	for _, sd := range apiServices() {
		ms := sd.Methods()
		for i := range ms.Len() {
			switch sd.Name() {
			case "SettingsService":
				switch ms.Get(i).Name() {
				case "GetFileSystemSnapshotBucketConfig", "UpdateFileSystemSnapshotBucketConfig", "GetBuildStorageConfig", "UpdateBuildStorageConfig",
					"CreateSecretStore", "GetSecretStore", "ListSecretStores", "UpdateSecretStore", "DeleteSecretStore":
				default:
					out = append(out, ms.Get(i))
				}
			}
		}
	}
	return out
}

// TestNotBuiltRPCsAnswerUnimplemented (issue 16 §5): every RPC sandboxd does not build
// yet answers UNIMPLEMENTED with reason CWSANDBOX_NOT_IMPLEMENTED on gRPC, gRPC-Web,
// Connect (JSON and binary) and REST (501, AIP-193 JSON), never a bare 404; without a key
// it is UNAUTHENTICATED first.
func TestNotBuiltRPCsAnswerUnimplemented(t *testing.T) {
	base, key := apiPort(t)
	mds := notBuilt()
	if len(mds) != 3 {
		t.Fatalf("%d RPCs not built, want 3: did a service lose or gain one?", len(mds))
	}
	for _, md := range mds {
		t.Run(string(md.Name()), func(t *testing.T) {
			for protocol := range rpcProtocols {
				for _, c := range []struct {
					codec rawCodec
					body  string
				}{{"proto", ""}, {"json", "{}"}} {
					err := call(t, base, key, procedure(md), protocol, c.codec, c.body)
					if connect.CodeOf(err) != connect.CodeUnimplemented || apierr.Reason(err) != apierr.NotImplemented {
						t.Errorf("%s %s: %v (reason %q), want UNIMPLEMENTED %s", protocol, c.codec, err, apierr.Reason(err), apierr.NotImplemented)
					}
				}
			}
			if err := call(t, base, "", procedure(md), "gRPC", "proto", ""); connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("gRPC without a key: %v, want UNAUTHENTICATED", err)
			}
			method, path, hasBody := binding(md)
			if method == "" {
				t.Fatalf("%s has no REST binding", md.FullName())
			}
			body := ""
			if hasBody {
				body = "{}"
			}
			r := rest(t, base, key, method, path, body)
			if r.code != http.StatusNotImplemented || r.status.GetCode() != int32(connect.CodeUnimplemented) || r.reason() != apierr.NotImplemented {
				t.Errorf("REST %s %s: %d %s, want 501 with code 12 and %s", method, path, r.code, r.body, apierr.NotImplemented)
			}
			if r := rest(t, base, "", method, path, body); r.code != http.StatusUnauthorized || r.reason() != apierr.Unauthenticated {
				t.Errorf("REST %s %s without a key: %d %s, want 401", method, path, r.code, r.body)
			}
		})
	}
}

// TestEveryRPCAnswersAStatus (issue 16 §5): every unary RPC of the port's services, over
// gRPC, Connect and its REST binding, answers either success or an error with a code and
// an ErrorInfo of ours: no bare HTTP status a client cannot parse, no UNKNOWN.
func TestEveryRPCAnswersAStatus(t *testing.T) {
	base, key := apiPort(t)
	for _, sd := range apiServices() {
		for i := range sd.Methods().Len() {
			md := sd.Methods().Get(i)
			if md.IsStreamingClient() || md.IsStreamingServer() {
				continue
			}
			for _, protocol := range []string{"gRPC", "Connect"} {
				err := call(t, base, key, procedure(md), protocol, "json", "{}")
				if err != nil && (connect.CodeOf(err) == connect.CodeUnknown || apierr.Reason(err) == "") {
					t.Errorf("%s over %s: %v: an error without an ErrorInfo of ours", md.FullName(), protocol, err)
				}
			}
			method, path, hasBody := binding(md)
			if method == "" {
				continue
			}
			body := ""
			if hasBody {
				body = "{}"
			}
			r := rest(t, base, key, method, path, body)
			if !json.Valid(r.body) || r.code >= 400 && (r.status.GetCode() == 0 || r.reason() == "") {
				t.Errorf("%s over REST %s %s: %d %s: not an AIP-193 answer", md.FullName(), method, path, r.code, r.body)
			}
		}
	}
}

// TestStrictJSON (issue 16 §11): an unknown field anywhere in a JSON body is
// INVALID_ARGUMENT with a field violation naming its path, on REST, Connect, gRPC-Web and
// gRPC; malformed JSON too; binary protobuf keeps ignoring unknown fields.
func TestStrictJSON(t *testing.T) {
	base, key := apiPort(t)
	const create = "/coreweave.sandbox.v1.SandboxService/CreateSandbox"
	cases := []struct {
		name, body string
		field      string // the violation's field; "" for malformed JSON
	}{
		{"typo", `{"spec":{"maxLifetimeSecnds":60}}`, "spec.maxLifetimeSecnds"},
		{"Kubernetes resources", `{"spec":{"containers":[{"image":"busybox"},{"image":"busybox","resources":{"limits":{"cpu":"1"}}}]}}`, "spec.containers[1].resources.limits"},
		{"top level", `{"spec":{},"metadata":{"name":"x"}}`, "metadata"},
		{"malformed", `{"spec":{"containers":[`, ""},
		{"not an object", `[1]`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// REST's body is the sandbox: paths are the body's.
			r := rest(t, base, key, "POST", "/v1/sandboxes", c.body)
			if r.code != 400 || r.status.GetCode() != int32(connect.CodeInvalidArgument) || r.reason() != apierr.InvalidRequest {
				t.Errorf("REST: %d %s, want 400 INVALID_ARGUMENT %s", r.code, r.body, apierr.InvalidRequest)
			} else if c.field != "" && (len(r.fields()) != 1 || !strings.HasPrefix(r.fields()[0], c.field+": ")) {
				t.Errorf("REST: violations %q, want one for %s", r.fields(), c.field)
			}
			// RPCs take the request: paths start at its sandbox field. (gRPC with JSON,
			// which no official client speaks, is left out: the transcoder answers its
			// decoding errors UNIMPLEMENTED "unary request has zero messages".)
			for _, protocol := range []string{"Connect", "gRPC-Web"} {
				err := call(t, base, key, create, protocol, "json", `{"sandbox":`+c.body+`}`)
				vs := apierr.Violations(err)
				if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
					t.Errorf("%s JSON: %v, want INVALID_ARGUMENT %s", protocol, err, apierr.InvalidRequest)
				} else if c.field != "" && (len(vs) != 1 || vs[0].Field != "sandbox."+c.field) {
					t.Errorf("%s JSON: violations %v, want one for sandbox.%s", protocol, vs, c.field)
				}
			}
		})
	}
	r := rest(t, base, key, "POST", "/v1/sandboxes", `{"spec":{"maxLifetimeSecnds":60}}`)
	if f := r.fields(); len(f) != 1 || !strings.Contains(f[0], `"maxLifetimeSeconds"`) {
		t.Errorf("a near miss is not named: %q", f)
	}
	// Binary protobuf: ListSandboxes{page_size: 5} with field 99, unknown to the server.
	msg, err := proto.Marshal(&sandboxv1.ListSandboxesRequest{PageSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	msg = protowire.AppendVarint(protowire.AppendTag(msg, 99, protowire.VarintType), 1)
	for protocol := range rpcProtocols {
		if err := call(t, base, key, "/coreweave.sandbox.v1.SandboxService/ListSandboxes", protocol, "proto", string(msg)); err != nil {
			t.Errorf("%s binary with an unknown field: %v, want it ignored", protocol, err)
		}
	}
}

// TestRESTQueryAndRoutes (issue 16 §11): REST GETs map query parameters onto request
// fields; an unknown parameter (system parameters of other APIs included), a value of the
// wrong type and a body where the route takes none are 400 INVALID_ARGUMENT with an
// AIP-193 body; an unknown path is 404 and a method the path does not take 405, with
// AIP-193 bodies too. Never a 500 or a bare status.
func TestRESTQueryAndRoutes(t *testing.T) {
	base, key := apiPort(t)
	if r := rest(t, base, key, "GET", "/v1/sandboxes?tags=a&tags=b&showTerminated=true&pageSize=5&state=STATE_RUNNING&page_token=", ""); r.code != 200 {
		t.Errorf("known parameters: %d %s", r.code, r.body)
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		grpcCode           connect.Code
		reason             string
		fields             []string // the violations' fields, sorted
	}{
		{"GET", "/v1/sandboxes?pageSize=5&nope=1&$alt=json", "", 400, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"$alt", "nope"}},
		{"GET", "/v1/sandboxes?alt=json", "", 400, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"alt"}},
		{"GET", "/v1/sandboxes/abc?sandboxId=abc&spec.tags=x", "", 400, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"spec.tags"}},
		{"GET", "/v1/sandbox/apiKeys?limit=3", "", 400, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"limit"}},
		{"GET", "/v1/sandboxes?pageSize=many", "", 400, connect.CodeInvalidArgument, apierr.InvalidRequest, nil},
		{"GET", "/v1/sandboxes", `{"pageSize":5}`, 400, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"body"}},
		{"GET", "/v1/nothing", "", 404, connect.CodeNotFound, apierr.RouteNotFound, nil},
		{"GET", "/nothing", "", 404, connect.CodeNotFound, apierr.RouteNotFound, nil},
		{"DELETE", "/v1/sandbox/nothing/x", "", 404, connect.CodeNotFound, apierr.RouteNotFound, nil},
		{"PUT", "/v1/sandboxes", "{}", 405, connect.CodeUnimplemented, apierr.NotImplemented, nil},
	} {
		r := rest(t, base, key, c.method, c.path, c.body)
		var fields []string
		for _, f := range r.fields() {
			fields = append(fields, strings.SplitN(f, ": ", 2)[0])
		}
		slices.Sort(fields)
		if r.code != c.code || r.status.GetCode() != int32(c.grpcCode) || r.reason() != c.reason || !slices.Equal(fields, c.fields) ||
			r.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %s %s, want %d with code %d, %s, violations %q", c.method, c.path, r.code, r.header.Get("Content-Type"), r.body,
				c.code, c.grpcCode, c.reason, c.fields)
		}
	}
	if r := rest(t, base, key, "PUT", "/v1/sandboxes", "{}"); r.header.Get("Allow") != "GET, POST" {
		t.Errorf("405 Allow: %q, want GET, POST", r.header.Get("Allow"))
	}
	// A body of unknown length (chunked) on a route without one: refused when it comes.
	req, _ := http.NewRequestWithContext(t.Context(), "DELETE", base+"/v1/sandboxes/abc", io.MultiReader(strings.NewReader(`{"gracePeriodSeconds":1}`)))
	req.Header.Set("Authorization", "Bearer "+key)
	if res, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 400 || !strings.Contains(string(b), apierr.InvalidRequest) {
			t.Errorf("chunked body on DELETE: %d %s, want 400 %s", res.StatusCode, b, apierr.InvalidRequest)
		}
	}
	// Authentication comes first: no key, no route lookup.
	if r := rest(t, base, "", "GET", "/v1/nothing?nope=1", ""); r.code != 401 || r.reason() != apierr.Unauthenticated {
		t.Errorf("without a key: %d %s, want 401", r.code, r.body)
	}
	// An RPC path no service has is UNIMPLEMENTED in the call's protocol.
	for protocol := range rpcProtocols {
		err := call(t, base, key, "/coreweave.sandbox.v1.SandboxService/Nope", protocol, "json", "{}")
		if connect.CodeOf(err) != connect.CodeUnimplemented || apierr.Reason(err) != apierr.NotImplemented {
			t.Errorf("unknown procedure over %s: %v, want UNIMPLEMENTED %s", protocol, err, apierr.NotImplemented)
		}
	}
}

// v1alpha sends the reflection client's v1 calls to v1alpha (the same messages).
type v1alpha struct{ http.RoundTripper }

func (t v1alpha) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Path = strings.Replace(r.URL.Path, "/grpc.reflection.v1.", "/grpc.reflection.v1alpha.", 1)
	return t.RoundTripper.RoundTrip(r)
}

// TestReflection (issue 16 §12): gRPC server reflection (v1 and v1alpha) on the API port
// lists exactly the port's services and resolves their methods' descriptors, describes
// none of the protos served elsewhere, and needs a key.
func TestReflection(t *testing.T) {
	base, key := apiPort(t)
	var want []string
	for _, sd := range apiServices() {
		want = append(want, string(sd.FullName()))
	}
	slices.Sort(want)
	for name, hc := range map[string]*http.Client{"v1": h2c(), "v1alpha": {Transport: v1alpha{h2c().Transport}}} {
		t.Run(name, func(t *testing.T) {
			stream := grpcreflect.NewClient(hc, base, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key))).NewStream(t.Context())
			defer stream.Close()
			names, err := stream.ListServices()
			if err != nil {
				t.Fatal(err)
			}
			got := make([]string, len(names))
			for i, n := range names {
				got[i] = string(n)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("services %v, want %v", got, want)
			}
			fds, err := stream.FileContainingSymbol("coreweave.sandbox.v1.VolumeService.ValidateVolume")
			if err != nil {
				t.Fatal(err)
			}
			files, err := protodesc.NewFiles(&descriptorpb.FileDescriptorSet{File: fds})
			if err != nil {
				t.Fatalf("the descriptors do not stand alone: %v", err)
			}
			d, err := files.FindDescriptorByName("coreweave.sandbox.v1.VolumeService.ValidateVolume")
			if err != nil {
				t.Fatal(err)
			}
			md := d.(protoreflect.MethodDescriptor)
			if md.Input().FullName() != "coreweave.sandbox.v1.ValidateVolumeRequest" || md.Output().FullName() != "coreweave.sandbox.v1.Volume" ||
				md.Output().Fields().ByName("status").Message().Fields().ByName("state").Enum().Values().ByName("VOLUME_STATE_READY").Number() != 2 {
				t.Errorf("ValidateVolume resolved as %v -> %v", md.Input().FullName(), md.Output().FullName())
			}
			rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
			if rule.GetPost() != "/v1/volumes/{volume_id}:validate" {
				t.Errorf("ValidateVolume's HTTP rule: %v", rule)
			}
			for _, internal := range []string{"sandboxd/runner/v1/runner.proto", "sandboxd/agent/v1/agent.proto", "coreweave/sandbox/v1/sandbox_data_plane.proto"} {
				if _, err := stream.FileByFilename(internal); connect.CodeOf(err) != connect.CodeNotFound {
					t.Errorf("%s: %v, want NOT_FOUND (not served on this port)", internal, err)
				}
			}
		})
	}
	stream := grpcreflect.NewClient(h2c(), base, connect.WithGRPC()).NewStream(t.Context())
	defer stream.Close()
	if _, err := stream.ListServices(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("without a key: %v, want UNAUTHENTICATED", err)
	}
}

// TestOpenAPIDocument (issue 16 §12): GET /openapi.json, without a key, is the OpenAPI
// document with a path for every REST route the port serves (from the google.api.http
// annotations the server routes by) and none it does not.
func TestOpenAPIDocument(t *testing.T) {
	base, _ := apiPort(t)
	r := rest(t, base, "", "GET", "/openapi.json", "")
	if r.code != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /openapi.json: %d %s", r.code, r.header.Get("Content-Type"))
	}
	var doc struct {
		Swagger string
		Info    struct{ Title string }
		Paths   map[string]map[string]json.RawMessage
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if doc.Swagger != "2.0" || doc.Info.Title != "sandboxd API" {
		t.Errorf("swagger %q, title %q (api/openapi.yaml sets it for the first file buf hands the generator)", doc.Swagger, doc.Info.Title)
	}
	routes, err := apifront.Routes(apiServices()...)
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, rt := range routes {
		served[rt.Method+" "+pathVar.ReplaceAllString(rt.Template, "{}")] = true
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for m := range ops {
			documented[strings.ToUpper(m)+" "+pathVar.ReplaceAllString(path, "{}")] = true
		}
	}
	for rt := range served {
		if !documented[rt] {
			t.Errorf("%s is served but not in the document (run make generate?)", rt)
		}
	}
	for rt := range documented {
		if !served[rt] {
			t.Errorf("%s is in the document but not served", rt)
		}
	}
	if len(served) < 40 {
		t.Errorf("only %d routes: the annotations were not read", len(served))
	}
}

// TestBuildLogURLIsPublicButSigned: GetSandboxBuildLogs's path takes no API key on the
// API port (the URL is its own authority), and a URL not signed by this gateway is 403
// naming nothing.
func TestBuildLogURLIsPublicButSigned(t *testing.T) {
	base, _ := apiPort(t)
	for _, q := range []string{"", "?org=org-1&build=b&expires=9999999999&token=AAAA", "?org=org-1&build=b&expires=1&token="} {
		res, err := http.Get(base + gateway.BuildLogPath + q)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "invalid or expired") {
			t.Errorf("%s: %d %q, want 403", q, res.StatusCode, b)
		}
	}
}

// TestBuildContextUploadRoute: PUT /v1/buildContexts/{name} reaches the gateway through
// the API front (not "no route"): here a gateway without a blob store says so; a query
// parameter is refused by the front; without a key it is 401.
func TestBuildContextUploadRoute(t *testing.T) {
	base, key := apiPort(t)
	put := func(path, k string) (int, string) {
		req, _ := http.NewRequest("PUT", base+path, strings.NewReader("tar"))
		if k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := put(gateway.BuildContextsPath+"app", key); code != http.StatusBadRequest || !strings.Contains(body, "blob store") {
		t.Errorf("put: %d %s", code, body)
	}
	if code, body := put(gateway.BuildContextsPath+"app?x=1", key); code != http.StatusBadRequest || !strings.Contains(body, "not a query parameter") {
		t.Errorf("query parameter: %d %s", code, body)
	}
	if code, body := put(gateway.BuildContextsPath+"app", ""); code != http.StatusUnauthorized {
		t.Errorf("no key: %d %s", code, body)
	}
}
