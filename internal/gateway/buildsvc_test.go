package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/build/v1/buildv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// buildingRunner is an acceptingRunner that builds images with build (a fake of
// runner.Local.Build) and reports builderImage, else unavailable, in its capacity.
type buildingRunner struct {
	acceptingRunner
	builderImage, unavailable string
	build                     func(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error)

	bmu      sync.Mutex
	reqs     []runner.BuildRequest
	contexts [][]byte
}

func (r *buildingRunner) Capacity(ctx context.Context) (runner.Capacity, error) {
	c, err := r.acceptingRunner.Capacity(ctx)
	c.BuilderImage, c.BuildUnavailable = r.builderImage, r.unavailable
	return c, err
}

func (r *buildingRunner) Build(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
	b, err := io.ReadAll(req.Context)
	if err != nil {
		return nil, err
	}
	r.bmu.Lock()
	r.reqs = append(r.reqs, req)
	r.contexts = append(r.contexts, b)
	r.bmu.Unlock()
	req.Context = bytes.NewReader(b)
	return r.build(ctx, req, emit)
}

func (r *buildingRunner) requests() ([]runner.BuildRequest, [][]byte) {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	return append([]runner.BuildRequest(nil), r.reqs...), append([][]byte(nil), r.contexts...)
}

// okBuild emits two steps with lines and succeeds with digest.
func okBuild(digest string) func(context.Context, runner.BuildRequest, func(imagebuild.Event)) (*runner.BuildResult, error) {
	return func(_ context.Context, _ runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
		steps := []imagebuild.Step{{Number: 1, Total: 2, Instruction: "FROM busybox"}, {Number: 2, Total: 2, Instruction: "RUN echo hi"}}
		for _, st := range steps {
			emit(imagebuild.Event{Step: &st, InStep: st.Number})
			emit(imagebuild.Event{Stream: imagebuild.Stdout, InStep: st.Number, Line: "output of " + st.Instruction})
		}
		steps[1].Cached = true
		return &runner.BuildResult{Result: &imagebuild.Result{Steps: steps}, Digest: digest}, nil
	}
}

type buildEnv struct {
	s                       *Server
	st                      store.Store
	url                     string
	admin, user, otherAdmin string // API keys
	c                       buildv1connect.BuildServiceClient
}

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// newBuildEnv is a gateway with builds over runners (a SQLite store under dir, so a
// second call on dir is a restarted gateway), a fake registry at reg.test:5000 and
// its API on an HTTP server.
func newBuildEnv(t *testing.T, dir string, opts func(*BuildOptions), runners ...runner.Handle) *buildEnv {
	t.Helper()
	return newBuildEnvPolicies(t, dir, opts, nil, runners...)
}

// newBuildEnvPolicies is newBuildEnv with the runners' policies from pols (nil: none).
func newBuildEnvPolicies(t *testing.T, dir string, opts func(*BuildOptions), pols policy.Source, runners ...runner.Handle) *buildEnv {
	t.Helper()
	return newBuildEnvConfig(t, dir, func(c *Config) {
		c.Policies = pols
		if opts != nil {
			opts(&c.Builds)
		}
	}, runners...)
}

// newBuildEnvConfig is newBuildEnv with the gateway's whole Config to change.
func newBuildEnvConfig(t *testing.T, dir string, opts func(*Config), runners ...runner.Handle) *buildEnv {
	t.Helper()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	e := &buildEnv{st: st}
	for _, k := range []struct {
		to        *string
		org, name string
		role      auth.Role
	}{{&e.admin, testOrg, "admin", auth.RoleAdmin}, {&e.user, testOrg, "user", auth.RoleUser}, {&e.otherAdmin, "org-b", "other", auth.RoleAdmin}} {
		if *k.to, _, err = keys.Create(k.org, k.role, k.name); err != nil {
			t.Fatal(err)
		}
	}
	bo := BuildOptions{Store: st.Builds(), Settings: st.BuildStorageConfigs(), RegistryHost: "reg.test:5000",
		MintPushToken: func(org string, _ time.Duration) (string, error) { return "push-" + org, nil },
		MintPullToken: func(org string, _ time.Duration) (string, error) { return "pull-" + org, nil }}
	cfg := Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs(), Templates: st.Templates(), Logger: quietLog(),
		ViewInterval: 50 * time.Millisecond, Builds: bo}
	if opts != nil {
		opts(&cfg)
	}
	e.s, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.s.Handler())
	t.Cleanup(func() { srv.Close(); e.s.Close() })
	e.url = srv.URL
	e.c = buildv1connect.NewBuildServiceClient(srv.Client(), srv.URL)
	return e
}

func as[T any](key string, m *T) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set("Authorization", "Bearer "+key)
	return r
}

func buildReq(template string, context string) *buildv1.StartBuildRequest {
	return &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Template{Template: template}, Context: []byte(context)}
}

// waitBuild polls build id until it is in state want.
func (e *buildEnv) waitBuild(t *testing.T, id string, want buildv1.BuildState) *buildv1.Build {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := e.c.GetBuild(t.Context(), as(e.admin, &buildv1.GetBuildRequest{BuildId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if b := res.Msg.GetBuild(); b.GetState() == want {
			return b
		} else if time.Now().After(deadline) {
			t.Fatalf("build %s is %s, want %s: %v", id, b.GetState(), want, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logs reads build id's log after after (following it when follow).
func (e *buildEnv) logs(t *testing.T, key, id string, after int64, follow bool) ([]*buildv1.BuildLogEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	stream, err := e.c.StreamBuildLogs(ctx, as(key, &buildv1.StreamBuildLogsRequest{BuildId: id, AfterSeq: after, Follow: follow}))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var out []*buildv1.BuildLogEvent
	for stream.Receive() {
		out = append(out, stream.Msg().GetEvent())
	}
	return out, stream.Err()
}

func wantBuildErr(t *testing.T, err error, code connect.Code, reason, field string) {
	t.Helper()
	wantTmplErr(t, err, code, reason, field)
}

// TestBuildService: a template build through the API end to end against a fake building
// runner: admin only, QUEUED at once, the runner asked with the registry's tokens and the
// template's repository, the log followed live to the final build, the template's image
// replaced by digest (revision + 1, the rest kept), request_id replays, another
// organization's build NOT_FOUND.
func TestBuildService(t *testing.T) {
	release := make(chan struct{})
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1"}
	r.build = func(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
		<-release // the test follows the log of a running build
		return okBuild(testDigest)(ctx, req, emit)
	}
	e := newBuildEnv(t, t.TempDir(), nil, r)
	ctx := t.Context()
	tp, err := createTemplate(tmplAdmin(testOrg), e.s, pyTemplate("My Py"), "")
	if err != nil {
		t.Fatal(err)
	}

	_, err = e.c.StartBuild(ctx, as(e.user, buildReq("My Py", "ctx")))
	wantBuildErr(t, err, connect.CodePermissionDenied, apierr.PermissionDenied, "")
	_, err = e.c.StartBuild(ctx, as(e.admin, &buildv1.StartBuildRequest{BuilderSize: "huge"}))
	wantBuildErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "builder_size")
	for _, f := range []string{"target", "context"} {
		wantBuildErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, f)
	}

	req := buildReq("My Py", "ctx-1")
	req.RequestId, req.BuildArgs = "req-1", map[string]string{"V": "1"}
	res, err := e.c.StartBuild(ctx, as(e.admin, req))
	if err != nil {
		t.Fatal(err)
	}
	b := res.Msg.GetBuild()
	if b.GetState() != buildv1.BuildState_BUILD_STATE_QUEUED || b.GetTemplate() != "My Py" || b.GetBuilderSize() != "medium" || b.GetDockerfile() != "Dockerfile" || b.GetCreateTime() == nil {
		t.Fatalf("started: %v", b)
	}
	e.waitBuild(t, b.GetBuildId(), buildv1.BuildState_BUILD_STATE_RUNNING)
	type result struct {
		evs []*buildv1.BuildLogEvent
		err error
	}
	followed := make(chan result, 1)
	go func() {
		evs, err := e.logs(t, e.user, b.GetBuildId(), 0, true)
		followed <- result{evs, err}
	}()
	time.Sleep(100 * time.Millisecond) // the follower waits on a running build
	close(release)
	got := <-followed
	if got.err != nil {
		t.Fatal(got.err)
	}
	var states []string
	var text []string
	for i, ev := range got.evs {
		if ev.GetSeq() != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.GetSeq())
		}
		switch {
		case ev.GetBuild() != nil:
			states = append(states, strings.TrimPrefix(ev.GetBuild().GetState().String(), "BUILD_STATE_"))
		case ev.GetStep() != nil:
			text = append(text, fmt.Sprintf("step %d %s", ev.GetStep().GetNumber(), ev.GetStep().GetInstruction()))
		default:
			text = append(text, ev.GetLine().GetText())
		}
	}
	if fmt.Sprint(states) != "[QUEUED RUNNING SUCCEEDED]" || !strings.Contains(strings.Join(text, "\n"), "step 2 RUN echo hi\noutput of RUN echo hi") {
		t.Fatalf("log: states %v\n%s", states, strings.Join(text, "\n"))
	}
	final := got.evs[len(got.evs)-1].GetBuild()
	image := "reg.test:5000/org-a/my-py@" + testDigest
	if final.GetImage() != image || final.GetImageDigest() != testDigest || final.GetTemplateId() != tp.GetSandboxTemplateId() || final.GetTemplateRevision() != 2 ||
		len(final.GetSteps()) != 2 || !final.GetSteps()[1].GetCached() || final.GetTotalSteps() != 2 || final.GetRunnerId() != "r1" || final.GetEndTime() == nil {
		t.Fatalf("final: %v", final)
	}
	if g := e.waitBuild(t, b.GetBuildId(), buildv1.BuildState_BUILD_STATE_SUCCEEDED); !proto.Equal(g, final) {
		t.Errorf("GetBuild %v\nfinal event %v", g, final)
	}
	reqs, contexts := r.requests()
	if len(reqs) != 1 || string(contexts[0]) != "ctx-1" {
		t.Fatalf("runner asked %d times: %+v", len(reqs), reqs)
	}
	rq := reqs[0]
	if rq.Push != "reg.test:5000/org-a/my-py:latest" || rq.PushUsername == "" || rq.PushPassword != "push-org-a" || rq.BaseCredentials == nil ||
		rq.BaseCredentials.Password != "pull-org-a" || rq.BaseCredentialsRegistry != "reg.test:5000" || rq.BuildArgs["V"] != "1" || rq.Resources.MilliCPU != 2000 || rq.Timeout != runner.DefaultBuildTimeout ||
		rq.ContextLimits.MaxBytes != MaxBuildContextUnpackedBytes || rq.OrganizationID != testOrg {
		t.Errorf("runner request: %+v", rq)
	}
	// The template: the image by digest, the rest kept.
	after, err := getTemplate(tmplUser(testOrg), e.s, "My Py", false)
	if err != nil {
		t.Fatal(err)
	}
	if c := after.GetSpec().GetContainers()[0]; after.GetRevision() != 2 || c.GetImage() != image || c.GetCommand() != "sleep" || after.GetSpec().GetMaxLifetimeSeconds() != 600 {
		t.Errorf("template after the build: %v", after)
	}

	// request_id: the same request is the same build; another is a conflict.
	again, err := e.c.StartBuild(ctx, as(e.admin, req))
	if err != nil || again.Msg.GetBuild().GetBuildId() != b.GetBuildId() || again.Msg.GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_SUCCEEDED {
		t.Fatalf("replay: %v, %v", again, err)
	}
	other := proto.CloneOf(req)
	other.Context = []byte("ctx-2")
	_, err = e.c.StartBuild(ctx, as(e.admin, other))
	wantBuildErr(t, err, connect.CodeInvalidArgument, apierr.RequestIDConflict, "request_id")

	// Reads: any key of the organization; another organization's is NOT_FOUND.
	if list, err := e.c.ListBuilds(ctx, as(e.user, &buildv1.ListBuildsRequest{Template: "My Py"})); err != nil || len(list.Msg.GetBuilds()) != 1 {
		t.Fatalf("list: %v, %v", list, err)
	}
	if list, err := e.c.ListBuilds(ctx, as(e.user, &buildv1.ListBuildsRequest{Template: "other"})); err != nil || len(list.Msg.GetBuilds()) != 0 {
		t.Fatalf("list of another template: %v, %v", list, err)
	}
	_, err = e.c.GetBuild(ctx, as(e.otherAdmin, &buildv1.GetBuildRequest{BuildId: b.GetBuildId()}))
	wantBuildErr(t, err, connect.CodeNotFound, apierr.BuildNotFound, "")
	_, err = e.logs(t, e.otherAdmin, b.GetBuildId(), 0, false)
	wantBuildErr(t, err, connect.CodeNotFound, apierr.BuildNotFound, "")
	_, err = e.c.CancelBuild(ctx, as(e.otherAdmin, &buildv1.CancelBuildRequest{BuildId: b.GetBuildId()}))
	wantBuildErr(t, err, connect.CodeNotFound, apierr.BuildNotFound, "")
	if list, err := e.c.ListBuilds(ctx, as(e.otherAdmin, &buildv1.ListBuildsRequest{})); err != nil || len(list.Msg.GetBuilds()) != 0 {
		t.Fatalf("another organization lists: %v, %v", list, err)
	}
	// after_seq resumes; without follow the stream ends with what is stored.
	rest, err := e.logs(t, e.user, b.GetBuildId(), 3, false)
	if err != nil || len(rest) != len(got.evs)-3 || rest[0].GetSeq() != 4 {
		t.Fatalf("after 3: %d events, %v", len(rest), err)
	}
	// Cancelling a build that ended returns it as it is.
	if c, err := e.c.CancelBuild(ctx, as(e.admin, &buildv1.CancelBuildRequest{BuildId: b.GetBuildId()})); err != nil || c.Msg.GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_SUCCEEDED {
		t.Fatalf("cancel an ended build: %v, %v", c, err)
	}

	// A build of a template that does not exist creates it with the image only; a
	// repository target pushes to the organization's repository and touches no template.
	res, err = e.c.StartBuild(ctx, as(e.admin, buildReq("fresh", "c")))
	if err != nil {
		t.Fatal(err)
	}
	fresh := e.waitBuild(t, res.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_SUCCEEDED)
	ft, err := getTemplate(tmplUser(testOrg), e.s, "fresh", false)
	if err != nil || ft.GetRevision() != 1 || ft.GetSandboxTemplateId() != fresh.GetTemplateId() || len(ft.GetSpec().GetContainers()) != 1 ||
		ft.GetSpec().GetContainers()[0].GetImage() != "reg.test:5000/org-a/fresh@"+testDigest {
		t.Fatalf("created template: %v, %v (build %v)", ft, err, fresh)
	}
	res, err = e.c.StartBuild(ctx, as(e.admin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "tools/x:v2"}, Context: []byte("c")}))
	if err != nil {
		t.Fatal(err)
	}
	repo := e.waitBuild(t, res.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_SUCCEEDED)
	if repo.GetImage() != "reg.test:5000/org-a/tools/x@"+testDigest || repo.GetTemplateId() != "" || repo.GetRepository() != "tools/x:v2" {
		t.Fatalf("repository build: %v", repo)
	}
	if reqs, _ := r.requests(); reqs[len(reqs)-1].Push != "reg.test:5000/org-a/tools/x:v2" {
		t.Errorf("pushed to %q", reqs[len(reqs)-1].Push)
	}
	if list, err := e.c.ListBuilds(ctx, as(e.user, &buildv1.ListBuildsRequest{PageSize: 2})); err != nil || len(list.Msg.GetBuilds()) != 2 ||
		list.Msg.GetBuilds()[0].GetBuildId() != repo.GetBuildId() || list.Msg.GetNextPageToken() == "" {
		t.Fatalf("list, newest first: %v, %v", list, err)
	}
}

// TestBuildFailures: a failing step names the step; a running build cancelled ends
// CANCELLED with the runner's stream cancelled; a queued one (the runner's one build
// slot taken) ends CANCELLED without reaching the runner; a build no runner can take
// FAILS naming each runner's reason; without a registry StartBuild is refused.
func TestBuildFailures(t *testing.T) {
	ctx := t.Context()
	block := make(chan struct{})
	var sawCancel sync.WaitGroup
	sawCancel.Add(1)
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1"}
	r.build = func(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
		switch string(mustRead(req)) {
		case "fail":
			f := imagebuild.Step{Number: 3, Total: 3, Instruction: "RUN false"}
			emit(imagebuild.Event{Step: &f, InStep: 3})
			return &runner.BuildResult{Result: &imagebuild.Result{ExitCode: 1, Steps: []imagebuild.Step{f}, Failed: &f, Why: "exit status 1"}}, nil
		case "block":
			select {
			case <-ctx.Done():
				sawCancel.Done()
				return nil, ctx.Err()
			case <-block:
				return nil, errors.New("unblocked")
			}
		}
		return okBuild(testDigest)(ctx, req, emit)
	}
	e := newBuildEnv(t, t.TempDir(), nil, r)

	res, err := e.c.StartBuild(ctx, as(e.admin, buildReq("t", "fail")))
	if err != nil {
		t.Fatal(err)
	}
	failed := e.waitBuild(t, res.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_FAILED)
	if failed.GetFailedStep().GetNumber() != 3 || failed.GetFailedStep().GetInstruction() != "RUN false" || failed.GetFailureReason() != BuildReasonStepFailed ||
		!strings.Contains(failed.GetFailureMessage(), "step 3/3 RUN false failed: exit status 1") || failed.GetImage() != "" {
		t.Fatalf("failed build: %v", failed)
	}
	if _, err := getTemplate(tmplUser(testOrg), e.s, "t", false); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a failed build made its template: %v", err)
	}

	running, err := e.c.StartBuild(ctx, as(e.admin, buildReq("t", "block")))
	if err != nil {
		t.Fatal(err)
	}
	e.waitBuild(t, running.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_RUNNING)
	queued, err := e.c.StartBuild(ctx, as(e.admin, buildReq("t", "other")))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // dispatch passes: one slot per runner
	if b := e.waitBuild(t, queued.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_QUEUED); b.GetRunnerId() != "" {
		t.Fatalf("second build placed: %v", b)
	}
	_, err = e.c.CancelBuild(ctx, as(e.user, &buildv1.CancelBuildRequest{BuildId: queued.Msg.GetBuild().GetBuildId()}))
	wantBuildErr(t, err, connect.CodePermissionDenied, apierr.PermissionDenied, "")
	c, err := e.c.CancelBuild(ctx, as(e.admin, &buildv1.CancelBuildRequest{BuildId: queued.Msg.GetBuild().GetBuildId()}))
	if err != nil || c.Msg.GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_CANCELLED || !strings.Contains(c.Msg.GetBuild().GetFailureMessage(), "cancelled by API key") {
		t.Fatalf("cancel queued: %v, %v", c, err)
	}
	c, err = e.c.CancelBuild(ctx, as(e.admin, &buildv1.CancelBuildRequest{BuildId: running.Msg.GetBuild().GetBuildId()}))
	if err != nil || c.Msg.GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_CANCELLED || c.Msg.GetBuild().GetEndTime() == nil {
		t.Fatalf("cancel running: %v, %v", c, err)
	}
	sawCancel.Wait() // the runner's Build saw its context end
	if reqs, _ := r.requests(); len(reqs) != 2 {
		t.Errorf("the runner got %d builds, want 2 (the queued one never reached it)", len(reqs))
	}
	evs, err := e.logs(t, e.user, c.Msg.GetBuild().GetBuildId(), 0, true)
	if err != nil || evs[len(evs)-1].GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_CANCELLED {
		t.Fatalf("log of the cancelled build: %v, %v", evs, err)
	}

	// No runner can build: the build fails naming why; no registry: refused at once.
	none := &buildingRunner{acceptingRunner: acceptingRunner{id: "plain"}, unavailable: "it has no builder image (runner flag --builder-image)"}
	e2 := newBuildEnv(t, t.TempDir(), nil, none, &acceptingRunner{id: "old"})
	res, err = e2.c.StartBuild(ctx, as(e2.admin, buildReq("t", "c")))
	if err != nil {
		t.Fatal(err)
	}
	nb := e2.waitBuild(t, res.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_FAILED)
	if nb.GetFailureReason() != apierr.BuildNotSupported || !strings.Contains(nb.GetFailureMessage(), "runner plain: it has no builder image") ||
		!strings.Contains(nb.GetFailureMessage(), "runner old: its connection carries no builds") {
		t.Fatalf("no builder: %v", nb)
	}
	e3 := newBuildEnv(t, t.TempDir(), func(o *BuildOptions) { o.MintPushToken = nil }, r)
	_, err = e3.c.StartBuild(ctx, as(e3.admin, buildReq("t", "c")))
	wantBuildErr(t, err, connect.CodeFailedPrecondition, apierr.BuildNotSupported, "")
}

func mustRead(req runner.BuildRequest) []byte {
	b, _ := io.ReadAll(req.Context)
	return b
}

// TestBuildLogBounds: a log over its line bound keeps its first lines, a line saying how
// many were dropped and its last lines.
func TestBuildLogBounds(t *testing.T) {
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "b"}
	r.build = func(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
		for i := range 1000 {
			emit(imagebuild.Event{Stream: imagebuild.Stdout, Line: fmt.Sprintf("line %d", i)})
		}
		return okBuild(testDigest)(ctx, req, func(imagebuild.Event) {})
	}
	e := newBuildEnv(t, t.TempDir(), func(o *BuildOptions) { o.MaxLogLines = 10 }, r)
	res, err := e.c.StartBuild(t.Context(), as(e.admin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "x"}, Context: []byte("c")}))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := e.logs(t, e.user, res.Msg.GetBuild().GetBuildId(), 0, true)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, ev := range evs {
		if l := ev.GetLine(); l != nil && l.GetStream() == buildv1.LogLine_STREAM_STDOUT {
			lines = append(lines, l.GetText())
		}
	}
	joined := strings.Join(lines, "|")
	if len(lines) != 10+buildLogTail || lines[9] != "line 9" || lines[10] != fmt.Sprintf("line %d", 1000-buildLogTail) || lines[len(lines)-1] != "line 999" {
		t.Fatalf("%d lines kept: %.300s", len(lines), joined)
	}
	var notice bool
	for _, ev := range evs {
		notice = notice || strings.Contains(ev.GetLine().GetText(), fmt.Sprintf("log truncated: %d lines dropped", 1000-10-buildLogTail))
	}
	if !notice || evs[len(evs)-1].GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_SUCCEEDED {
		t.Fatalf("no truncation notice or final event (%d events)", len(evs))
	}
}

// TestBuildRestart: builds the store has QUEUED or RUNNING when a gateway starts (its
// previous process died under them) end FAILED, their logs with a final event.
func TestBuildRestart(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []*buildv1.Build{{BuildId: "b-running", State: buildv1.BuildState_BUILD_STATE_RUNNING}, {BuildId: "b-queued", State: buildv1.BuildState_BUILD_STATE_QUEUED},
		{BuildId: "b-done", State: buildv1.BuildState_BUILD_STATE_SUCCEEDED}} {
		rec, _ := proto.Marshal(b)
		if _, err := st.Builds().Create(t.Context(), store.Build{ID: b.BuildId, Org: testOrg, State: int32(b.State), Record: rec}); err != nil {
			t.Fatal(err)
		}
	}
	ev, _ := proto.Marshal(&buildv1.BuildLogEvent{Seq: 1, Event: &buildv1.BuildLogEvent_Line{Line: &buildv1.LogLine{Text: "was running"}}})
	if err := st.Builds().AppendEvents(t.Context(), "b-running", 1, [][]byte{ev}); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	e := newBuildEnv(t, dir, nil, &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "b"})
	for id, was := range map[string]string{"b-running": "RUNNING", "b-queued": "QUEUED"} {
		b := e.waitBuild(t, id, buildv1.BuildState_BUILD_STATE_FAILED)
		if b.GetFailureReason() != BuildReasonGatewayRestarted || !strings.Contains(b.GetFailureMessage(), "restarted while the build was "+was) {
			t.Errorf("%s: %v", id, b)
		}
		evs, err := e.logs(t, e.user, id, 0, true)
		if err != nil || len(evs) == 0 || evs[len(evs)-1].GetBuild().GetState() != buildv1.BuildState_BUILD_STATE_FAILED {
			t.Fatalf("%s log: %v, %v", id, evs, err)
		}
	}
	if evs, _ := e.logs(t, e.user, "b-running", 0, false); len(evs) != 3 || evs[0].GetLine().GetText() != "was running" || evs[2].GetSeq() != 3 {
		t.Errorf("b-running's log: %v", evs)
	}
	e.waitBuild(t, "b-done", buildv1.BuildState_BUILD_STATE_SUCCEEDED)
}

// TestBuildREST: StartBuild over REST (the context base64 in JSON), GetBuild and
// ListBuilds by template; unknown fields are refused.
func TestBuildREST(t *testing.T) {
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "b", build: okBuild(testDigest)}
	e := newBuildEnv(t, t.TempDir(), nil, r)
	call := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(res.Body).Decode(&out)
		return res.StatusCode, out
	}
	ctxB64 := base64.StdEncoding.EncodeToString([]byte("rest-context"))
	if code, out := call("POST", "/v1/builds", e.admin, `{"template": "web", "context": "`+ctxB64+`", "nope": 1}`); code != http.StatusBadRequest {
		t.Fatalf("unknown field: %d %v", code, out)
	}
	if code, out := call("POST", "/v1/builds", e.user, `{"template": "web", "context": "`+ctxB64+`"}`); code != http.StatusForbidden {
		t.Fatalf("user: %d %v", code, out)
	}
	code, out := call("POST", "/v1/builds", e.admin, `{"template": "web", "context": "`+ctxB64+`", "buildArgs": {"A": "b"}}`)
	b, _ := out["build"].(map[string]any)
	if code != http.StatusOK || b["state"] != "BUILD_STATE_QUEUED" {
		t.Fatalf("start: %d %v", code, out)
	}
	id := b["buildId"].(string)
	e.waitBuild(t, id, buildv1.BuildState_BUILD_STATE_SUCCEEDED)
	if code, out := call("GET", "/v1/builds/"+id, e.user, ""); code != http.StatusOK || out["build"].(map[string]any)["imageDigest"] != testDigest {
		t.Fatalf("get: %d %v", code, out)
	}
	if code, out := call("GET", "/v1/builds?template=web", e.user, ""); code != http.StatusOK || len(out["builds"].([]any)) != 1 {
		t.Fatalf("list: %d %v", code, out)
	}
	if code, out := call("GET", "/v1/builds/"+id, e.otherAdmin, ""); code != http.StatusNotFound {
		t.Fatalf("another organization: %d %v", code, out)
	}
	// The log: newline-delimited JSON (the transcoder carries no such stream).
	logs := func(key, query string) (int, string, []string) {
		req, _ := http.NewRequest("GET", e.url+"/v1/builds/"+id+"/logs"+query, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("Content-Type"), strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	code, ct, lines := logs(e.user, "?follow=true")
	if code != http.StatusOK || ct != "application/x-ndjson" || len(lines) < 4 || !strings.Contains(lines[0], `"seq":"1"`) ||
		!strings.Contains(lines[len(lines)-1], "BUILD_STATE_SUCCEEDED") {
		t.Fatalf("REST log: %d %s %q", code, ct, lines)
	}
	if code, _, after := logs(e.user, "?after_seq=2"); code != http.StatusOK || len(after) != len(lines)-2 || !strings.Contains(after[0], `"seq":"3"`) {
		t.Fatalf("REST log after 2: %d %q", code, after)
	}
	if code, _, out := logs(e.otherAdmin, ""); code != http.StatusNotFound || !strings.Contains(out[0], apierr.BuildNotFound) {
		t.Fatalf("REST log of another organization: %d %q", code, out)
	}
	if code, _, out := logs(e.user, "?after_seq=x"); code != http.StatusBadRequest {
		t.Fatalf("REST log after_seq=x: %d %q", code, out)
	}
	if _, contexts := r.requests(); len(contexts) != 1 || string(contexts[0]) != "rest-context" {
		t.Fatalf("context: %q", contexts)
	}
	tp, err := getTemplate(tmplUser(testOrg), e.s, "web", false)
	if err != nil || tp.GetSpec().GetContainers()[0].GetImage() != "reg.test:5000/org-a/web@"+testDigest {
		t.Fatalf("template: %v, %v", tp, err)
	}
}

// TestBuildQueueBounds: an organization's builds beyond its bound are refused
// CWSANDBOX_SERVER_BUSY with a retry delay; a build that finds no free runner within the
// queue wait fails CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED naming why; a builder larger than
// every runner fails at once CWSANDBOX_BUILD_NOT_SUPPORTED.
func TestBuildQueueBounds(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "b"}
	r.build = func(ctx context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil, errors.New("stopped")
	}
	e := newBuildEnv(t, t.TempDir(), func(o *BuildOptions) { o.MaxPerOrg, o.QueueWait = 2, 300*time.Millisecond }, r)
	ctx := t.Context()
	first, err := e.c.StartBuild(ctx, as(e.admin, buildReq("t", "1")))
	if err != nil {
		t.Fatal(err)
	}
	e.waitBuild(t, first.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_RUNNING)
	second, err := e.c.StartBuild(ctx, as(e.admin, buildReq("t", "2")))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.c.StartBuild(ctx, as(e.admin, buildReq("t", "3")))
	wantBuildErr(t, err, connect.CodeResourceExhausted, apierr.ServerBusy, "")
	if apierr.RetryInfo(err) == nil {
		t.Errorf("no retry delay: %v", err)
	}
	// The second waits for r1's one slot past the queue wait.
	b := e.waitBuild(t, second.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_FAILED)
	if b.GetFailureReason() != apierr.RunnerCapacityExhausted || !strings.Contains(b.GetFailureMessage(), "runner r1: runs 1 builds, its maximum") {
		t.Fatalf("queued past the wait: %v", b)
	}
	// Larger than any runner (4 CPUs, 8 GiB here; "large" asks 4 CPUs, 8 GiB: fits; a
	// runner of 2 CPUs does not).
	small := &buildingRunner{acceptingRunner: acceptingRunner{id: "tiny"}, builderImage: "b"}
	small.build = r.build
	e2 := newBuildEnv(t, t.TempDir(), nil, &tinyRunner{small})
	res, err := e2.c.StartBuild(ctx, as(e2.admin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "x"}, Context: []byte("c"), BuilderSize: "large"}))
	if err != nil {
		t.Fatal(err)
	}
	b = e2.waitBuild(t, res.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_FAILED)
	if b.GetFailureReason() != apierr.BuildNotSupported || !strings.Contains(b.GetFailureMessage(), "runner tiny: has less than the builder's large") {
		t.Fatalf("builder larger than every runner: %v", b)
	}
}

// tinyRunner is a building runner of 2 CPUs and 2 GiB.
type tinyRunner struct{ *buildingRunner }

func (r *tinyRunner) Capacity(ctx context.Context) (runner.Capacity, error) {
	c, err := r.buildingRunner.Capacity(ctx)
	c.MilliCPU, c.MemoryBytes = 2000, 2<<30
	return c, err
}

// TestBuildPlacementPolicy: a runner whose policy's resource limits cannot hold the
// requested builder size is skipped (the build runs on one whose policy can); when no
// runner's can, the build fails at once CWSANDBOX_BUILD_NOT_SUPPORTED naming each
// runner's constraint and limit.
func TestBuildPlacementPolicy(t *testing.T) {
	ctx := t.Context()
	tight := &buildingRunner{acceptingRunner: acceptingRunner{id: "tight"}, builderImage: "b", build: okBuild(testDigest)}
	roomy := &buildingRunner{acceptingRunner: acceptingRunner{id: "roomy"}, builderImage: "b", build: okBuild(testDigest)}
	pols := policyByRunner(func(id string) string {
		switch id {
		case "tight":
			return `{"constraints": {"resources": {"max_cpu": "1", "total_memory": "1Gi"}}}`
		case "roomy":
			return `{"constraints": {"resources": {"max_cpu": "2", "max_memory": "2Gi"}}}`
		}
		return ""
	})
	e := newBuildEnvPolicies(t, t.TempDir(), nil, pols, tight, roomy)
	res, err := e.c.StartBuild(ctx, as(e.admin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "x"}, Context: []byte("c")}))
	if err != nil {
		t.Fatal(err)
	}
	b := e.waitBuild(t, res.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_SUCCEEDED)
	if b.GetRunnerId() != "roomy" {
		t.Errorf("a medium builder ran on %q, want roomy (tight's policy allows 1 CPU)", b.GetRunnerId())
	}
	if reqs, _ := tight.requests(); len(reqs) != 0 {
		t.Errorf("tight got %d builds", len(reqs))
	}
	// large (4 CPUs, 8 GiB): no runner's policy holds it.
	res, err = e.c.StartBuild(ctx, as(e.admin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "x"}, Context: []byte("c"), BuilderSize: "large"}))
	if err != nil {
		t.Fatal(err)
	}
	b = e.waitBuild(t, res.Msg.GetBuild().GetBuildId(), buildv1.BuildState_BUILD_STATE_FAILED)
	msg := b.GetFailureMessage()
	for _, want := range []string{"runner tight: its policy does not allow the builder large", "constraint constraints.resources.max_cpu, limit 1]",
		"constraint constraints.resources.total_memory, limit 1Gi]", "runner roomy: its policy does not allow the builder large",
		"constraint constraints.resources.max_cpu, limit 2]", "constraint constraints.resources.max_memory, limit 2Gi]"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure message lacks %q: %s", want, msg)
		}
	}
	if b.GetFailureReason() != apierr.BuildNotSupported {
		t.Errorf("failure reason %q", b.GetFailureReason())
	}
}
