package gateway

import (
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// newTestGatewayOver is a gateway over the store newTestGateway made in dir: a restart.
func newTestGatewayOver(t *testing.T, dir string, runners ...runner.Handle) *Server {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func fileRequest(contents, requestID string) *connect.Request[sandboxv1.CreateSandboxFromFileRequest] {
	return connect.NewRequest(&sandboxv1.CreateSandboxFromFileRequest{
		Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Contents: []byte(contents), RequestId: requestID, Tags: []string{"compose"},
	})
}

const oneService = `services:
  web:
    image: python:3
    command: ["python3", "-m", "http.server", "8000"]
    expose: [8000]
    tmpfs: [/cache]
`

// TestCreateFromFile: a Compose file takes CreateSandbox's path; the runner gets the
// spec plus what the wire cannot carry (tmpfs, the service names as host names).
func TestCreateFromFile(t *testing.T) {
	dir := t.TempDir()
	r := &acceptingRunner{id: "r1"}
	s := newTestGateway(t, dir, r)
	ctx := asOrg(t.Context())
	const id = "5d0e7a50-0000-4000-8000-0000000000f1"
	res, err := s.CreateSandboxFromFile(ctx, fileRequest(oneService, id))
	if err != nil {
		t.Fatal(err)
	}
	sb := res.Msg
	got := r.spec(sb.GetSandboxId()).Spec
	if got.Image != "python:3" || strings.Join(got.Args, " ") != "python3 -m http.server 8000" || strings.Join(got.Tmpfs, ",") != "/cache" ||
		strings.Join(got.HostAliases, ",") != "web" || len(got.Services) != 1 || got.Services[0].Port != 8000 {
		t.Errorf("the runner got %+v", got)
	}
	if c := sb.GetSpec().GetContainers(); len(c) != 1 || c[0].GetName() != "web" || strings.Join(sb.GetSpec().GetTags(), ",") != "compose" {
		t.Errorf("the answer's spec %v: want the translated spec", sb.GetSpec())
	}

	// The same request again: the same sandbox.
	again, err := s.CreateSandboxFromFile(ctx, fileRequest(oneService, id))
	if err != nil || again.Msg.GetSandboxId() != sb.GetSandboxId() {
		t.Fatalf("replay: %v, %v; want sandbox %s", again, err, sb.GetSandboxId())
	}
	// Other bytes (a whitespace edit), other options, or a CreateSandbox: a conflict.
	other := fileRequest(oneService+"\n", id)
	moreTags := fileRequest(oneService, id)
	moreTags.Msg.Tags = append(moreTags.Msg.Tags, "x")
	for name, req := range map[string]*connect.Request[sandboxv1.CreateSandboxFromFileRequest]{"whitespace": other, "options": moreTags} {
		_, err := s.CreateSandboxFromFile(ctx, req)
		if apierr.Reason(err) != apierr.RequestIDConflict || connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: err = %v, want %s", name, err, apierr.RequestIDConflict)
		}
	}
	_, err = s.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{RequestId: id,
		Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "python:3"}}}}}))
	if apierr.Reason(err) != apierr.RequestIDConflict {
		t.Errorf("CreateSandbox with the file's request_id: err = %v, want %s", err, apierr.RequestIDConflict)
	}

	// A restarted gateway (its index from the store) still knows the request.
	s.Close()
	s2 := newTestGatewayOver(t, dir, r)
	if _, err := s2.CreateSandboxFromFile(ctx, other); apierr.Reason(err) != apierr.RequestIDConflict {
		t.Errorf("after a restart: err = %v, want %s", err, apierr.RequestIDConflict)
	}
	if again, err := s2.CreateSandboxFromFile(ctx, fileRequest(oneService, id)); err != nil || again.Msg.GetSandboxId() != sb.GetSandboxId() {
		t.Errorf("replay after a restart: %v, %v", again, err)
	}
}

func TestCreateFromFileRefusals(t *testing.T) {
	r := &acceptingRunner{id: "r1"}
	s := newTestGateway(t, t.TempDir(), r)
	ctx := asOrg(t.Context())
	engine := fileRequest(oneService, "")
	engine.Msg.Control = sandboxv1.Control_CONTROL_CONTAINER_ENGINE
	for _, tc := range []struct {
		name   string
		req    *connect.Request[sandboxv1.CreateSandboxFromFileRequest]
		reason string
		field  string
	}{
		{"refused key", fileRequest("services: {a: {image: x, privileged: true}}", ""), apierr.InvalidRequest, "services.a.privileged"},
		{"build from a context", fileRequest("services: {a: {build: .}}", ""), apierr.InvalidRequest, "build_contexts[a]"},
		{"build without builds", fileRequest("services: {a: {build: {dockerfile_inline: 'FROM x'}}}", ""), apierr.NotImplemented, ""},
		{"engine", engine, apierr.NoSuitableRunner, ""},
		{"bad request_id", fileRequest(oneService, strings.Repeat("x", MaxRequestIDBytes+1)), apierr.InvalidRequest, "request_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.CreateSandboxFromFile(ctx, tc.req)
			if apierr.Reason(err) != tc.reason {
				t.Fatalf("err = %v, want %s", err, tc.reason)
			}
			if tc.field != "" {
				if vs := apierr.Violations(err); len(vs) == 0 || vs[0].Field != tc.field {
					t.Fatalf("violations %v, want %s", vs, tc.field)
				}
			}
		})
	}
	if len(r.got) != 0 {
		t.Errorf("the runner got %d sandboxes; want none", len(r.got))
	}
}

// TestCreateFromFileEngine: a Compose file under control CONTROL_CONTAINER_ENGINE goes
// to the runner that runs engines (never to one that does not), as one container
// cws-engine running that runner's engine image under its engine runtime class, with the
// file's engine; the sandbox says its control.
func TestCreateFromFileEngine(t *testing.T) {
	none := &acceptingRunner{id: "r1"}
	engine := &acceptingRunner{id: "r2", engineImage: "localhost/engine:1"}
	s := newTestGateway(t, t.TempDir(), none, engine)
	ctx := asOrg(t.Context())
	req := fileRequest("services: {web: {image: busybox:1, ports: [\"8080:80\"]}, db: {image: busybox:2}}", "")
	req.Msg.Control = sandboxv1.Control_CONTROL_CONTAINER_ENGINE
	res, err := s.CreateSandboxFromFile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(none.got) != 0 || len(engine.got) != 1 {
		t.Fatalf("runner without an engine got %d, with one %d sandboxes", len(none.got), len(engine.got))
	}
	got := engine.spec(res.Msg.GetSandboxId()).Spec
	if got.Name != runtime.EngineContainerName || got.Image != "localhost/engine:1" || got.RuntimeClass != "gvisor" || got.Multi() {
		t.Errorf("the runner got container %q image %q under %q", got.Name, got.Image, got.RuntimeClass)
	}
	if e := got.Engine; e == nil || strings.Join(e.Images, ",") != "busybox:2,busybox:1" || e.Project == "" || len(e.Compose) == 0 {
		t.Errorf("engine %+v", got.Engine)
	}
	if len(got.Services) != 1 || got.Services[0].Port != 8080 {
		t.Errorf("services %+v", got.Services)
	}
	if res.Msg.GetControl() != sandboxv1.Control_CONTROL_CONTAINER_ENGINE {
		t.Errorf("control %v", res.Msg.GetControl())
	}
	if cs := res.Msg.GetSpec().GetContainers(); len(cs) != 1 || cs[0].GetName() != runtime.EngineContainerName {
		t.Errorf("the sandbox's containers %v", cs)
	}
}
