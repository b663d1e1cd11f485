package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/relay"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// gw is a gateway over a real single-host stack, served over h2c like `sandboxd dev`.
type gw struct {
	url             string
	keyA, keyB      string // organizations a and b
	sandboxes       sandboxv1connect.SandboxServiceClient
	other           sandboxv1connect.SandboxServiceClient // org b
	discovery       sandboxv1connect.DiscoveryServiceClient
	unauthenticated sandboxv1connect.SandboxServiceClient
}

func startGateway(t *testing.T, opts ...func(*gateway.Config)) *gw {
	t.Helper()
	return startGatewayOn(t, startedStack(t), opts...)
}

// startGatewayOn is startGateway on the stack s.
func startGatewayOn(t *testing.T, s *stack.Stack, opts ...func(*gateway.Config)) *gw {
	t.Helper()
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	keyA, _, _ := keys.Create("org-a", auth.RoleUser, "")
	keyB, _, _ := keys.Create("org-b", auth.RoleUser, "")
	cfg := gateway.Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("local", s.Runner)}}
	for _, o := range opts {
		o(&cfg)
	}
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.EnableHTTP2 = true
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	client := func(key string) sandboxv1connect.SandboxServiceClient {
		opts := []connect.ClientOption{connect.WithGRPC(), connect.WithReadMaxBytes(relay.MaxMessageBytes), connect.WithSendMaxBytes(relay.MaxMessageBytes)}
		if key != "" {
			opts = append(opts, connect.WithInterceptors(connecttest.Bearer(key)))
		}
		return sandboxv1connect.NewSandboxServiceClient(hc, srv.URL, opts...)
	}
	return &gw{
		url: srv.URL, keyA: keyA, keyB: keyB,
		sandboxes:       client(keyA),
		other:           client(keyB),
		unauthenticated: client(""),
		discovery:       sandboxv1connect.NewDiscoveryServiceClient(hc, srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(keyA))),
	}
}

func spec(image string, command string, args ...string) *sandboxv1.SandboxSpec {
	return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: image, Command: command, Args: args}}}
}

func (g *gw) create(t *testing.T, sp *sandboxv1.SandboxSpec, requestID string) *sandboxv1.Sandbox {
	t.Helper()
	res, err := g.sandboxes.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}, RequestId: requestID}))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return res.Msg
}

func (g *gw) waitState(t *testing.T, id string, want sandboxv1.State) *sandboxv1.Sandbox {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := g.sandboxes.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		st := res.Msg.GetStatus()
		if st.GetState() == want {
			return res.Msg
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s is %s (%s), want %s", id, st.GetState(), st.GetStateReason(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sleeperSpec() *sandboxv1.SandboxSpec {
	return spec(busybox(), "/bin/sh", "-c", `trap "exit 0" TERM; sleep infinity & wait`)
}

func TestGatewayAuthAndScoping(t *testing.T) {
	g := startGateway(t)
	ctx := context.Background()
	_, err := g.unauthenticated.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated || apierr.Reason(err) != apierr.Unauthenticated {
		t.Errorf("no key: %v, want UNAUTHENTICATED", err)
	}
	bad := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, g.url, connect.WithInterceptors(connecttest.Bearer("sbx_nope_nope")))
	if _, err := bad.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("wrong key: %v, want UNAUTHENTICATED", err)
	}
	sb := g.create(t, sleeperSpec(), "")
	for name, call := range map[string]func() error{
		"get": func() error {
			_, err := g.other.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.SandboxId}))
			return err
		},
		"delete": func() error {
			_, err := g.other.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.SandboxId}))
			return err
		},
		"exec": func() error {
			_, err := g.other.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"true"}}))
			return err
		},
		"read": func() error {
			_, err := g.other.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: sb.SandboxId, Path: "/etc/hostname"}))
			return err
		},
	} {
		if err := call(); connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.SandboxNotFound {
			t.Errorf("%s of another organization's sandbox: %v, want NOT_FOUND", name, err)
		}
	}
	list, err := g.other.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{ShowTerminated: true}))
	if err != nil || len(list.Msg.Sandboxes) != 0 {
		t.Errorf("other organization lists %d sandboxes (%v), want 0", len(list.Msg.GetSandboxes()), err)
	}
}

func TestGatewayLifecycle(t *testing.T) {
	g := startGateway(t)
	ctx := context.Background()
	sp := sleeperSpec()
	sp.Tags = []string{"suite", "lifecycle"}
	sp.MaxLifetimeSeconds = 120
	sp.Containers[0].Resources = &sandboxv1.Resources{Cpu: "500m", Memory: "256Mi"}
	first := g.create(t, sp, "req-1")
	if first.GetSandboxId() == "" || first.GetStatus().GetState() != sandboxv1.State_STATE_CREATING {
		t.Fatalf("create returned %s in %s, want an ID in CREATING", first.GetSandboxId(), first.GetStatus().GetState())
	}
	again := g.create(t, sp, "req-1")
	if again.GetSandboxId() != first.GetSandboxId() {
		t.Errorf("same request_id created %s and %s", first.GetSandboxId(), again.GetSandboxId())
	}
	running := g.waitState(t, first.SandboxId, sandboxv1.State_STATE_RUNNING)
	st := running.GetStatus()
	if st.GetRunnerId() != "local" || st.GetStartTime() == nil || st.GetCreateTime() == nil || st.GetEffectiveMaxLifetimeSeconds() != 120 {
		t.Errorf("status %v", st)
	}
	if st.GetEffectiveResources().GetCpu() != "500m" || st.GetEffectiveResources().GetMemory() != "256Mi" {
		t.Errorf("effective resources %v", st.GetEffectiveResources())
	}
	if st.ExitCode != nil {
		t.Errorf("exit code present while running: %d", st.GetExitCode())
	}

	exec, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: first.SandboxId, Command: []string{"sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x; exit 3"}, MaxOutputBytes: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	if e := exec.Msg; e.ExitCode != 3 || len(e.Stdout) != 1000 || !e.StdoutTruncated || e.StdoutBytesProduced != 5000 {
		t.Errorf("exec: exit %d, %d bytes, truncated %v, produced %d", e.ExitCode, len(e.Stdout), e.StdoutTruncated, e.StdoutBytesProduced)
	}

	// Listing: by tag, by state, paginated.
	other := g.create(t, spec(busybox(), "true"), "")
	g.waitState(t, other.SandboxId, sandboxv1.State_STATE_COMPLETED)
	for _, tc := range []struct {
		name string
		req  *sandboxv1.ListSandboxesRequest
		want []string
	}{
		{"active only by default", &sandboxv1.ListSandboxesRequest{}, []string{first.SandboxId}},
		{"show terminated", &sandboxv1.ListSandboxesRequest{ShowTerminated: true}, []string{first.SandboxId, other.SandboxId}},
		{"terminal state filter", &sandboxv1.ListSandboxesRequest{State: sandboxv1.State_STATE_COMPLETED}, []string{other.SandboxId}},
		{"tags are ANDed", &sandboxv1.ListSandboxesRequest{Tags: []string{"suite", "lifecycle"}, ShowTerminated: true}, []string{first.SandboxId}},
		{"unknown tag", &sandboxv1.ListSandboxesRequest{Tags: []string{"suite", "nope"}}, nil},
		{"runner filter", &sandboxv1.ListSandboxesRequest{RunnerIds: []string{"elsewhere"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(tc.req))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range res.Msg.Sandboxes {
				got = append(got, s.SandboxId)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("listed %v, want %v", got, tc.want)
			}
		})
	}
	page1, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{PageSize: 1, ShowTerminated: true}))
	if err != nil || len(page1.Msg.Sandboxes) != 1 || page1.Msg.NextPageToken == "" {
		t.Fatalf("page 1: %v %v", page1, err)
	}
	page2, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{PageSize: 1, ShowTerminated: true, PageToken: page1.Msg.NextPageToken}))
	if err != nil || len(page2.Msg.Sandboxes) != 1 || page2.Msg.Sandboxes[0].SandboxId == page1.Msg.Sandboxes[0].SandboxId {
		t.Fatalf("page 2: %v %v", page2, err)
	}
	completed := g.waitState(t, other.SandboxId, sandboxv1.State_STATE_COMPLETED)
	if completed.GetStatus().ExitCode == nil || completed.GetStatus().GetExitCode() != 0 {
		t.Errorf("completed sandbox exit code %v, want present and 0", completed.GetStatus().ExitCode)
	}

	del, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: first.SandboxId, GracePeriodSeconds: 10}))
	if err != nil || del.Msg.GetSandbox().GetStatus().GetState() != sandboxv1.State_STATE_TERMINATING {
		t.Fatalf("delete: %v %v", del, err)
	}
	g.waitState(t, first.SandboxId, sandboxv1.State_STATE_TERMINATED)
	_, err = g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: first.SandboxId, Command: []string{"true"}}))
	if apierr.Reason(err) != apierr.SandboxNotRunning {
		t.Errorf("exec in a terminated sandbox: %v, want CWSANDBOX_SANDBOX_NOT_RUNNING", err)
	}
	if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: "nosuchsandbox", AllowMissing: true})); err != nil {
		t.Errorf("delete missing with allow_missing: %v", err)
	}
	if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: "nosuchsandbox"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("delete missing: %v, want NOT_FOUND", err)
	}
}

func TestGatewayPurge(t *testing.T) {
	g := startGateway(t)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		sp := sleeperSpec()
		sp.Tags = []string{"purge-me"}
		g.create(t, sp, "")
	}
	keep := g.create(t, sleeperSpec(), "")
	for _, tc := range []struct {
		name string
		req  *sandboxv1.PurgeSandboxesRequest
		code connect.Code
		n    int32
	}{
		{"no scope", &sandboxv1.PurgeSandboxesRequest{}, connect.CodeInvalidArgument, 0},
		{"both scopes", &sandboxv1.PurgeSandboxesRequest{Tags: []string{"x"}, PurgeAll: true}, connect.CodeInvalidArgument, 0},
		{"request id", &sandboxv1.PurgeSandboxesRequest{Tags: []string{"x"}, RequestId: "r"}, connect.CodeUnimplemented, 0},
		{"dry run", &sandboxv1.PurgeSandboxesRequest{Tags: []string{"purge-me"}, DryRun: true}, 0, 3},
		{"by tag", &sandboxv1.PurgeSandboxesRequest{Tags: []string{"purge-me"}}, 0, 3},
		{"again: nothing active left", &sandboxv1.PurgeSandboxesRequest{Tags: []string{"purge-me"}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := g.sandboxes.PurgeSandboxes(ctx, connect.NewRequest(tc.req))
			if tc.code != 0 {
				if connect.CodeOf(err) != tc.code {
					t.Errorf("purge: %v, want %v", err, tc.code)
				}
				return
			}
			if err != nil || res.Msg.PurgeCount != tc.n {
				t.Errorf("purge: %v %v, want count %d", res, err, tc.n)
			}
		})
	}
	g.waitState(t, keep.SandboxId, sandboxv1.State_STATE_RUNNING)
}

func TestGatewayStreamsAndFiles(t *testing.T) {
	g := startGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sp := spec(busybox(), "/bin/sh", "-c", `echo one; sleep 0.2; echo two >&2; trap "exit 0" TERM; sleep infinity & wait`)
	sb := g.create(t, sp, "")

	// StreamExec: half-close right after init is stdin EOF, not a cancellation.
	stream := g.sandboxes.StreamExec(ctx)
	if err := stream.Send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Init{Init: &sandboxv1.ExecStreamInit{SandboxId: sb.SandboxId, Command: []string{"sh", "-c", "cat; echo done"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Stdin{Stdin: []byte("piped\n")}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var gotReady, gotExit bool
	for {
		m, err := stream.Receive()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		switch {
		case m.GetReady() != nil:
			gotReady = !gotExit && out.Len() == 0
		case m.GetOutput() != nil:
			out.Write(m.GetOutput().GetData())
		case m.GetExit() != nil:
			gotExit = m.GetExit().GetExitCode() == 0
		}
	}
	if !gotReady || !gotExit || out.String() != "piped\ndone\n" {
		t.Errorf("stream exec: ready first %v, exit 0 %v, output %q", gotReady, gotExit, out.String())
	}

	// Files: a round trip, the unary cap, and the reasons the client maps.
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	if _, err := g.sandboxes.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: sb.SandboxId, Path: "/tmp/a/b.bin", Content: data})); err != nil {
		t.Fatal(err)
	}
	read, err := g.sandboxes.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: sb.SandboxId, Path: "/tmp/a/b.bin"}))
	if err != nil || !bytes.Equal(read.Msg.Content, data) {
		t.Fatalf("read back: %d bytes, %v", len(read.Msg.GetContent()), err)
	}
	_, err = g.sandboxes.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: sb.SandboxId, Path: "/no/such"}))
	if info := apierr.Info(err); info.GetReason() != apierr.FileNotFound || info.GetMetadata()["filepath"] != "/no/such" {
		t.Errorf("missing file: %v", err)
	}
	big := make([]byte, relay.MaxUnaryFileBytes+1)
	_, err = g.sandboxes.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: sb.SandboxId, Path: "/tmp/big", Content: big}))
	if info := apierr.Info(err); info.GetReason() != apierr.FileTooLarge || info.GetMetadata()["max_size_bytes"] != fmt.Sprint(relay.MaxUnaryFileBytes) {
		t.Errorf("oversized write: %v", err)
	}
	if _, err := g.sandboxes.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: sb.SandboxId, Path: "/tmp/big", Content: big[:20<<20]})); err != nil {
		t.Errorf("20 MiB write: %v", err)
	}

	// Logs: finite without follow, timestamps, and resume by session and offset.
	logs := func(req *sandboxv1.StreamLogsRequest) ([]*sandboxv1.LogEntry, error) {
		req.SandboxId = sb.SandboxId
		s, err := g.sandboxes.StreamLogs(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		var out []*sandboxv1.LogEntry
		for s.Receive() {
			out = append(out, s.Msg())
		}
		return out, s.Err()
	}
	var entries []*sandboxv1.LogEntry
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) { // until "two" is written
		entries, err = logs(&sandboxv1.StreamLogsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(entries); (n > 0 && strings.Contains(string(entries[n-1].Data), "two")) || time.Now().After(deadline) {
			break
		}
	}
	var all bytes.Buffer
	var session string
	var next uint64
	for _, e := range entries {
		all.Write(e.Data)
		if e.NextLogOffset != next+uint64(len(e.Data)) {
			t.Errorf("offset %d after %d bytes from %d", e.NextLogOffset, len(e.Data), next)
		}
		next, session = e.NextLogOffset, e.LogSessionId
	}
	if all.String() != "one\ntwo\n" || session == "" {
		t.Errorf("logs %q session %q", all.String(), session)
	}
	stamped, err := logs(&sandboxv1.StreamLogsRequest{Timestamps: true, TailLines: 1})
	if err != nil || len(stamped) == 0 || !strings.HasSuffix(string(stamped[len(stamped)-1].Data), " two\n") || !strings.HasPrefix(string(stamped[0].Data), "20") {
		t.Errorf("timestamped tail: %v %v", stamped, err)
	}
	unknown, err := logs(&sandboxv1.StreamLogsRequest{Follow: true, ResumeLogSessionId: "nope"})
	if err != nil || len(unknown) != 1 || unknown[0].GetError().GetCode() != "SESSION_NOT_FOUND" {
		t.Errorf("unknown session: %v %v", unknown, err)
	}
	if _, err := logs(&sandboxv1.StreamLogsRequest{ResumeLogSessionId: session}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("resume without follow: %v, want INVALID_ARGUMENT", err)
	}
}

func TestGatewayRejectsWhatItCannotHonour(t *testing.T) {
	g := startGateway(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		spec   *sandboxv1.SandboxSpec
		code   connect.Code
		reason string
		field  string
	}{
		{"no containers", &sandboxv1.SandboxSpec{}, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers"},
		{"no image", spec("", "true"), connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].image"},
		{"bad cpu", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.Containers[0].Resources = &sandboxv1.Resources{Cpu: "lots"}
			return s
		}(), connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.containers[0].resources.cpu"},
		{"lifetime over 30 days", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.MaxLifetimeSeconds = 31 * 24 * 3600
			return s
		}(), connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.max_lifetime_seconds"},
		{"malformed runtime class", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.RuntimeClass = "Kata_Containers"
			return s
		}(), connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.runtime_class"},
		{"runtime class no runner offers", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.RuntimeClass = "kata"
			return s
		}(), connect.CodeInvalidArgument, apierr.PlacementRejected, "sandbox.spec.runtime_class"},
		{"public service without an endpoint", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.Services = []*sandboxv1.Service{{Port: 8443, Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC}}
			return s
		}(), connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.services[0].endpoint"},
		{"public endpoint on a runner without an edge", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.Services = []*sandboxv1.Service{{Port: 8443, Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC,
				Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS}}}
			return s
		}(), connect.CodeInvalidArgument, apierr.PlacementRejected, "sandbox.spec.services[0].endpoint"},
		{"egress selector", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Selector{
				Selector: &sandboxv1.SelectorBlock{PodLabels: map[string]string{"app": "db"}}}}}}
			return s
		}(), connect.CodeUnimplemented, apierr.NotImplemented, ""},
		{"egress CIDR with host bits", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: "10.1.2.3/8"}}}}}
			return s
		}(), connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox.spec.network.egress[0].cidr"},
		{"pinned to an unknown runner", func() *sandboxv1.SandboxSpec {
			s := spec(busybox(), "true")
			s.RunnerIds = []string{"elsewhere"}
			return s
		}(), connect.CodeFailedPrecondition, apierr.NoSuitableRunner, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: tc.spec}}))
			if connect.CodeOf(err) != tc.code || apierr.Reason(err) != tc.reason {
				t.Fatalf("create: %v, want %v %s", err, tc.code, tc.reason)
			}
			if tc.field == "" {
				return
			}
			found := false
			for _, v := range apierr.Violations(err) {
				found = found || v.Field == tc.field
			}
			if !found {
				t.Errorf("violations %v do not name %s", apierr.Violations(err), tc.field)
			}
		})
	}
	list, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{ShowTerminated: true}))
	if err != nil || len(list.Msg.Sandboxes) != 0 {
		t.Errorf("rejected creates left %d sandboxes (%v)", len(list.Msg.GetSandboxes()), err)
	}
}

func TestGatewayDiscovery(t *testing.T) {
	g := startGateway(t)
	ctx := context.Background()
	basic, err := g.discovery.ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{View: sandboxv1.RunnerView_RUNNER_VIEW_BASIC}))
	if err != nil || len(basic.Msg.Runners) != 1 {
		t.Fatalf("list: %v %v", basic, err)
	}
	r := basic.Msg.Runners[0]
	if r.RunnerId != "local" || !r.Healthy || r.ConnectedAt == nil || r.Resources != nil || r.Capabilities.GetMaxCpuMillicores() <= 0 {
		t.Errorf("basic view: %v", r)
	}
	if vis := r.Capabilities.GetSupportedServiceVisibilities(); !slices.Contains(vis, sandboxv1.Visibility_VISIBILITY_CUSTOM) ||
		slices.Contains(vis, sandboxv1.Visibility_VISIBILITY_PUBLIC) {
		t.Errorf("visibilities of a runner without an edge: %v", vis)
	}
	custom, err := g.discovery.ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{ServiceVisibility: sandboxv1.Visibility_VISIBILITY_CUSTOM}))
	if err != nil || len(custom.Msg.Runners) != 1 {
		t.Errorf("runners for CUSTOM services: %v %v", custom, err)
	}
	full, err := g.discovery.GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{RunnerId: "local", OrganizationId: "org-a", View: sandboxv1.RunnerView_RUNNER_VIEW_FULL}))
	if err != nil || full.Msg.Resources == nil || full.Msg.Resources.AvailableMemoryBytes <= 0 {
		t.Errorf("full view: %v %v", full, err)
	}
	if _, err := g.discovery.GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{RunnerId: "nope", OrganizationId: "org-a"})); apierr.Reason(err) != apierr.RunnerNotFound {
		t.Errorf("unknown runner: %v", err)
	}
	none, err := g.discovery.ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{GpuType: "H100"}))
	if err != nil || len(none.Msg.Runners) != 0 {
		t.Errorf("GPU filter: %v %v", none, err)
	}
}

// TestGatewayREST drives the API with plain HTTP/JSON, as curl would, through the
// google.api.http routes.
func TestGatewayREST(t *testing.T) {
	g := startGateway(t)
	call := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		b, _ := io.ReadAll(res.Body)
		if len(b) > 0 {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("%s %s: %d %q is not JSON", method, path, res.StatusCode, b)
			}
		}
		return res.StatusCode, out
	}
	if code, _ := call("GET", "/v1/sandboxes", "", ""); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/sandboxes without a key: %d, want 401", code)
	}
	code, created := call("POST", "/v1/sandboxes", g.keyA, fmt.Sprintf(`{"spec":{"containers":[{"name":"main","image":%q,"command":"/bin/sh","args":["-c","trap 'exit 0' TERM; sleep infinity & wait"]}],"tags":["rest"]}}`, busybox()))
	id, _ := created["sandboxId"].(string)
	if code != http.StatusOK || id == "" {
		t.Fatalf("POST /v1/sandboxes: %d %v", code, created)
	}
	g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
	code, got := call("GET", "/v1/sandboxes/"+id, g.keyA, "")
	if code != http.StatusOK || got["status"].(map[string]any)["state"] != "STATE_RUNNING" {
		t.Errorf("GET sandbox: %d %v", code, got)
	}
	code, exec := call("POST", "/v1/sandboxes/"+id+":exec", g.keyA, `{"command":["sh","-c","echo rest"]}`)
	if code != http.StatusOK || exec["stdout"] != "cmVzdAo=" { // base64 of "rest\n"
		t.Errorf("exec: %d %v", code, exec)
	}
	if code, _ := call("POST", "/v1/sandboxes/"+id+":writeFile", g.keyA, `{"path":"/tmp/r.txt","content":"aGk="}`); code != http.StatusOK {
		t.Errorf("writeFile: %d", code)
	}
	code, file := call("GET", "/v1/sandboxes/"+id+":readFile?path=/tmp/r.txt", g.keyA, "")
	if code != http.StatusOK || file["content"] != "aGk=" {
		t.Errorf("readFile: %d %v", code, file)
	}
	if code, _ := call("GET", "/v1/sandboxes/"+id, g.keyB, ""); code != http.StatusNotFound {
		t.Errorf("another organization's GET: %d, want 404", code)
	}
	code, list := call("GET", "/v1/sandboxes?tags=rest", g.keyA, "")
	if sbs, _ := list["sandboxes"].([]any); code != http.StatusOK || len(sbs) != 1 {
		t.Errorf("list by tag: %d %v", code, list)
	}
	if code, del := call("DELETE", "/v1/sandboxes/"+id+"?gracePeriodSeconds=5", g.keyA, ""); code != http.StatusOK {
		t.Errorf("DELETE: %d %v", code, del)
	}
	g.waitState(t, id, sandboxv1.State_STATE_TERMINATED)
}

// TestGatewayResponsesUncompressed: a client that offers gzip (as the official client and
// connect-go do on every call) and sends gzip gets its answer uncompressed.
func TestGatewayResponsesUncompressed(t *testing.T) {
	g := startGateway(t)
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	rec := &connecttest.EnvelopeFlags{Base: &http.Transport{Protocols: p}}
	c := sandboxv1connect.NewDiscoveryServiceClient(&http.Client{Transport: rec}, g.url,
		connect.WithGRPC(), connect.WithSendGzip(), connect.WithInterceptors(connecttest.Bearer(g.keyA)))
	res, err := c.ListAvailableRunners(context.Background(), connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{}))
	if err != nil || len(res.Msg.GetRunners()) == 0 {
		t.Fatalf("ListAvailableRunners: %v (%d runners)", err, len(res.Msg.GetRunners()))
	}
	if f := rec.Flags(); len(f) != 1 || f[0]&1 != 0 {
		t.Fatalf("response envelope flags %v, want one uncompressed message", rec.Flags())
	}
}
