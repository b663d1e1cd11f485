package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/klauspost/compress/zstd"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/build/v1/buildv1connect"
	"github.com/sandboxd/sandboxd/internal/buildfake"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func newBuildServer(t *testing.T) (*buildfake.Server, *Client) {
	t.Helper()
	s := &buildfake.Server{}
	mux := http.NewServeMux()
	mux.Handle(buildv1connect.NewBuildServiceHandler(s))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := New("http://"+ln.Addr().String(), "k", WithDataPlane(DataPlaneGateway))
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// writeTree makes files (path → content; a content "->target" is a symlink, a path
// ending in / a directory) under a new directory.
func writeTree(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "->"); ok {
			err = os.Symlink(target, full)
		} else {
			err = os.WriteFile(full, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// archiveEntries lists an fsarchive archive: name → type and, for a symlink, target.
func archiveEntries(t testing.TB, data []byte) map[string]string {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			out[h.Name] = "dir"
		case tar.TypeSymlink:
			out[h.Name] = "->" + h.Linkname
		default:
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestSDKPackBuildContext: .dockerignore excludes (with exceptions reaching into an
// excluded directory), the Dockerfile and .dockerignore are kept even when excluded, a
// symlink out of the directory is stored as a symlink, and the archive extracts.
func TestSDKPackBuildContext(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := writeTree(t, map[string]string{
		"Dockerfile":         "FROM busybox\n",
		".dockerignore":      "# comment\n**/*.log\nnode_modules\nbuild/\n!build/keep.txt\nDockerfile\n.dockerignore\n",
		"app/main.py":        "print(1)\n",
		"app/debug.log":      "x",
		"top.log":            "x",
		"node_modules/a/b":   "x",
		"build/out.o":        "x",
		"build/keep.txt":     "kept",
		"link-out":           "->" + filepath.Join(outside, "secret"),
		"app/link-rel":       "->../Dockerfile",
		"empty/":             "",
		"sub/dir/Dockerfile": "FROM scratch\n",
	})
	bc, err := PackBuildContext(context.Background(), dir, PackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := archiveEntries(t, bc.Archive)
	want := []string{"./", ".dockerignore", "Dockerfile", "app/", "app/link-rel", "app/main.py", "build/", "build/keep.txt",
		"empty/", "link-out", "sub/", "sub/dir/", "sub/dir/Dockerfile"}
	if !slices.Equal(keys(got), want) {
		t.Fatalf("entries %q, want %q", keys(got), want)
	}
	if got["link-out"] != "->"+filepath.Join(outside, "secret") || got["app/link-rel"] != "->../Dockerfile" || got["build/keep.txt"] != "kept" {
		t.Errorf("entries %q", got)
	}
	if bc.Dockerfile != "Dockerfile" || bc.Entries != int64(len(want)) {
		t.Errorf("context %q, %d entries", bc.Dockerfile, bc.Entries)
	}
	// It is an archive the builder's agent accepts.
	root := t.TempDir()
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fsarchive.Extract(context.Background(), bytes.NewReader(bc.Archive), f, runtime.ArchiveLimits{MaxFiles: 100, MaxBytes: 1 << 20}, fsarchive.IDMap{}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "app/main.py")); err != nil || string(b) != "print(1)\n" {
		t.Errorf("app/main.py: %q %v", b, err)
	}

	// Another Dockerfile, excluded by a directory pattern, is kept (its directory too).
	if err := os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte("sub\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bc, err = PackBuildContext(context.Background(), dir, PackOptions{Dockerfile: "sub/dir/Dockerfile"})
	if err != nil {
		t.Fatal(err)
	}
	got = archiveEntries(t, bc.Archive)
	if got["sub/dir/Dockerfile"] != "FROM scratch\n" || got["sub/"] != "dir" || bc.Dockerfile != "sub/dir/Dockerfile" {
		t.Errorf("entries %q", keys(got))
	}
}

func TestSDKPackBuildContextRefuses(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"Dockerfile": "FROM busybox\n", "a": "0123456789", "b": "0123456789",
		"real/Dockerfile": "FROM busybox\n", "via": "->real", "lnk": "->Dockerfile",
	})
	ctx := context.Background()
	for _, tc := range []struct {
		opts PackOptions
		want string
		is   error
	}{
		{PackOptions{Dockerfile: "../Dockerfile"}, "relative", nil},
		{PackOptions{Dockerfile: "/etc/passwd"}, "relative", nil},
		{PackOptions{Dockerfile: "nope"}, "no Dockerfile nope", nil},
		{PackOptions{Dockerfile: "via/Dockerfile"}, "through the symlink via", nil},
		{PackOptions{Dockerfile: "lnk"}, "through the symlink lnk", nil},
		{PackOptions{Dockerfile: "real"}, "not a regular file", nil},
		{PackOptions{MaxEntries: 3}, "entries", ErrContextTooLarge},
		{PackOptions{MaxBytes: 15}, "bytes", ErrContextTooLarge},
		{PackOptions{MaxArchiveBytes: 20}, "exceeds 20 bytes", ErrContextTooLarge},
	} {
		_, err := PackBuildContext(ctx, dir, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("%+v: %v", tc.opts, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte("!\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := PackBuildContext(ctx, dir, PackOptions{}); err == nil || !strings.Contains(err.Error(), ".dockerignore") {
		t.Errorf("a bad .dockerignore: %v", err)
	}
	if _, err := PackBuildContext(ctx, filepath.Join(dir, "missing"), PackOptions{}); err == nil {
		t.Error("a missing directory was packed")
	}
}

// FuzzSDKBuildContextPatterns: whatever the .dockerignore and the Dockerfile path, the
// packer fails cleanly or makes an archive Extract accepts, holding the Dockerfile and
// nothing outside the tree.
func FuzzSDKBuildContextPatterns(f *testing.F) {
	for _, seed := range []struct{ ignore, df string }{
		{"", "Dockerfile"}, {"*\n!Dockerfile\n", ""}, {"a\n!a/b/c\n", "a/Dockerfile"}, {"**/*.go\n", "../x"},
		{"[\n", "Dockerfile"}, {"!\n", ""}, {"/a/../../b\n", "a//Dockerfile"}, {"\xef\xbb\xbfa\n#x\n", "./a/Dockerfile"},
	} {
		f.Add(seed.ignore, seed.df)
	}
	dir := writeTree(f, map[string]string{
		"Dockerfile": "FROM busybox\n", "a/Dockerfile": "FROM busybox\n", "a/b/c": "c", "a/x.go": "x",
		"b/link": "->../../etc", "c/": "",
	})
	f.Fuzz(func(t *testing.T, ignore, df string) {
		if len(ignore) > 4096 {
			return
		}
		if err := os.WriteFile(filepath.Join(dir, ".dockerignore"), []byte(ignore), 0o644); err != nil {
			t.Fatal(err)
		}
		bc, err := PackBuildContext(context.Background(), dir, PackOptions{Dockerfile: df, MaxEntries: 100})
		if err != nil {
			return
		}
		got := archiveEntries(t, bc.Archive)
		if got[bc.Dockerfile] != "FROM busybox\n" {
			t.Fatalf("Dockerfile %q missing from %q", bc.Dockerfile, keys(got))
		}
		for name := range got {
			if strings.HasPrefix(name, "/") || slices.Contains(strings.Split(name, "/"), "..") {
				t.Fatalf("entry %q leaves the root", name)
			}
		}
		root := t.TempDir()
		rf, err := os.Open(root)
		if err != nil {
			t.Fatal(err)
		}
		defer rf.Close()
		if _, err := fsarchive.Extract(context.Background(), bytes.NewReader(bc.Archive), rf, runtime.ArchiveLimits{MaxFiles: 100, MaxBytes: 1 << 20}, fsarchive.IDMap{}); err != nil {
			t.Fatalf("Extract: %v", err)
		}
	})
}

func buildEvents() []*buildv1.BuildLogEvent {
	out := buildv1.LogLine_STREAM_STDOUT
	return []*buildv1.BuildLogEvent{
		buildfake.Final(&buildv1.Build{State: buildv1.BuildState_BUILD_STATE_RUNNING, TotalSteps: 2}),
		buildfake.Step(1, "FROM busybox", true),
		buildfake.Step(2, "RUN false", false),
		buildfake.Line(2, out, "hello"),
		buildfake.Final(&buildv1.Build{State: buildv1.BuildState_BUILD_STATE_FAILED, TotalSteps: 2,
			FailedStep:    &buildv1.BuildStep{Number: 2, Instruction: "RUN false"},
			FailureReason: "BuildStepFailed", FailureMessage: "exit status 1"}),
	}
}

func TestSDKBuildCalls(t *testing.T) {
	srv, c := newBuildServer(t)
	ctx := context.Background()
	srv.Log = buildEvents()[:4] // stays RUNNING

	// A transient failure is retried with the same request ID.
	srv.FailNext = apiError(connect.CodeUnavailable, ReasonBackendUnavailable, nil)
	b, err := c.StartBuild(ctx, BuildTarget{Repository: "tools:1"}, []byte("archive"), BuildOptions{
		Dockerfile: "d/Dockerfile", BuildArgs: map[string]string{"V": "1"}, TargetStage: "final", BuilderSize: "small",
		Timeout: 1500 * time.Millisecond, NoCache: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(srv.Starts) != 2 || srv.Starts[0].GetRequestId() == "" || srv.Starts[0].GetRequestId() != srv.Starts[1].GetRequestId() {
		t.Fatalf("start requests %v", srv.Starts)
	}
	req := srv.Starts[1]
	if req.GetRepository() != "tools:1" || req.GetDockerfile() != "d/Dockerfile" || req.GetBuildArgs()["V"] != "1" || req.GetTargetStage() != "final" ||
		req.GetBuilderSize() != "small" || req.GetTimeoutSeconds() != 2 || !req.GetNoCache() || string(req.GetContext()) != "archive" {
		t.Errorf("request %v", req)
	}
	if b.State != BuildQueued || b.Repository != "tools:1" || b.ID == "" {
		t.Errorf("build %+v", b)
	}
	for _, bad := range []BuildTarget{{}, {Template: "a", Repository: "b"}} {
		if _, err := c.StartBuild(ctx, bad, []byte("x"), BuildOptions{}); err == nil {
			t.Errorf("target %+v accepted", bad)
		}
	}
	if _, err := c.StartBuild(ctx, BuildTarget{Template: "a"}, nil, BuildOptions{}); err == nil {
		t.Error("no context accepted")
	}
	if len(srv.Starts) != 2 {
		t.Errorf("refused calls reached the server: %d", len(srv.Starts))
	}

	got, err := c.GetBuild(ctx, b.ID)
	if err != nil || got.State != BuildRunning {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := c.GetBuild(ctx, "nope"); !errors.Is(err, ErrBuildNotFound) || errors.Is(err, ErrNotFound) {
		t.Errorf("missing build: %v", err)
	}

	// Logs without follow: what is there, no final build.
	var seen []int64
	last, err := c.BuildLogs(ctx, b.ID, BuildLogOptions{}, func(e BuildEvent) error { seen = append(seen, e.Seq); return nil })
	if err != nil || !slices.Equal(seen, []int64{1, 2, 3, 4}) || last == nil || last.State != BuildRunning {
		t.Fatalf("logs %v, last %+v, %v", seen, last, err)
	}
	seen = nil
	if _, err := c.BuildLogs(ctx, b.ID, BuildLogOptions{AfterSeq: 2}, func(e BuildEvent) error { seen = append(seen, e.Seq); return nil }); err != nil || !slices.Equal(seen, []int64{3, 4}) {
		t.Fatalf("logs after 2: %v %v", seen, err)
	}
	boom := errors.New("stop")
	if _, err := c.BuildLogs(ctx, b.ID, BuildLogOptions{}, func(BuildEvent) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("callback error: %v", err)
	}

	cb, err := c.CancelBuild(ctx, b.ID)
	if err != nil || cb.State != BuildCancelled {
		t.Fatalf("cancel: %+v %v", cb, err)
	}
	final, err := c.FollowBuild(ctx, b.ID, 0, nil)
	if !errors.Is(err, ErrBuildCancelled) || final.State != BuildCancelled {
		t.Errorf("follow a cancelled build: %+v %v", final, err)
	}
}

// TestSDKFollowBuildResumes: a followed log that breaks is reopened after the last
// event seen (each event reported once); one that fails to open is retried.
func TestSDKFollowBuildResumes(t *testing.T) {
	srv, c := newBuildServer(t)
	srv.Log = buildEvents()
	b, err := c.StartBuild(context.Background(), BuildTarget{Template: "t"}, []byte("x"), BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.BreakAfter = 2
	var seen []int64
	final, err := c.FollowBuild(context.Background(), b.ID, 0, func(e BuildEvent) error { seen = append(seen, e.Seq); return nil })
	if !errors.Is(err, ErrBuildFailed) || final.State != BuildFailed || !slices.Equal(seen, []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("seen %v, final %+v, err %v", seen, final, err)
	}
	if len(srv.LogReqs) != 2 || srv.LogReqs[1].GetAfterSeq() != 2 || !srv.LogReqs[1].GetFollow() {
		t.Errorf("log requests %v", srv.LogReqs)
	}
	srv.FailNext = apiError(connect.CodeUnavailable, "", nil)
	seen = nil
	if _, err := c.FollowBuild(context.Background(), b.ID, 3, func(e BuildEvent) error { seen = append(seen, e.Seq); return nil }); !errors.Is(err, ErrBuildFailed) || !slices.Equal(seen, []int64{4, 5}) {
		t.Errorf("after a failed open: seen %v, %v", seen, err)
	}
	srv.FailNext = apiError(connect.CodeInvalidArgument, ReasonInvalidRequest, nil)
	if _, err := c.FollowBuild(context.Background(), b.ID, 0, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a final error was retried: %v", err)
	}
}

func TestSDKListBuildsPages(t *testing.T) {
	srv, c := newBuildServer(t)
	for i := range 5 {
		tmpl := "a"
		if i%2 == 1 {
			tmpl = "b"
		}
		srv.Add(&buildv1.Build{BuildId: "b" + string(rune('1'+i)), State: buildv1.BuildState_BUILD_STATE_SUCCEEDED, Target: &buildv1.Build_Template{Template: tmpl}})
	}
	list, err := c.ListBuilds(context.Background(), BuildListOptions{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, b := range list {
		ids = append(ids, b.ID)
	}
	if !slices.Equal(ids, []string{"b5", "b4", "b3", "b2", "b1"}) || len(srv.ListReqs) != 3 {
		t.Fatalf("ids %v after %d calls", ids, len(srv.ListReqs))
	}
	list, err = c.ListBuilds(context.Background(), BuildListOptions{Template: "b"})
	if err != nil || len(list) != 2 || list[0].Template != "b" {
		t.Fatalf("template b: %v %v", list, err)
	}
}

// TestSDKBuildTemplate: packs, starts with the template target, reports every event and
// returns a failed build as a *BuildError naming the step.
func TestSDKBuildTemplate(t *testing.T) {
	srv, c := newBuildServer(t)
	srv.Log = buildEvents()
	dir := writeTree(t, map[string]string{"Dockerfile": "FROM busybox\nRUN false\n", "f": "x", ".dockerignore": "f\n"})
	var events []BuildEvent
	var started *Build
	b, err := c.BuildTemplate(context.Background(), "tools", dir, BuildTemplateOptions{
		OnStart: func(b *Build) { started = b },
		OnEvent: func(e BuildEvent) error { events = append(events, e); return nil },
	})
	var be *BuildError
	if !errors.As(err, &be) || !errors.Is(err, ErrBuildFailed) {
		t.Fatalf("err %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "failed at step 2/2 (RUN false): BuildStepFailed: exit status 1") {
		t.Errorf("message %q", msg)
	}
	if b.State != BuildFailed || b.FailedStep.Number != 2 || started == nil || started.State != BuildQueued || len(events) != 5 {
		t.Fatalf("build %+v, started %+v, %d events", b, started, len(events))
	}
	if e := events[2]; e.Step == nil || e.Step.Instruction != "RUN false" || events[3].Line.Text != "hello" || events[3].Line.Stream != LogStreamStdout {
		t.Errorf("events %+v", events)
	}
	req := srv.Starts[0]
	if req.GetTemplate() != "tools" || req.GetDockerfile() != "Dockerfile" {
		t.Errorf("request %v", req)
	}
	if ents := archiveEntries(t, req.GetContext()); !slices.Equal(keys(ents), []string{"./", ".dockerignore", "Dockerfile"}) {
		t.Errorf("context %q", keys(ents))
	}

	srv.Log[len(srv.Log)-1] = buildfake.Final(&buildv1.Build{State: buildv1.BuildState_BUILD_STATE_SUCCEEDED, Image: "reg/o/tools@sha256:ab", TemplateId: "t1"})
	b, err = c.BuildTemplate(context.Background(), "tools", dir, BuildTemplateOptions{})
	if err != nil || b.State != BuildSucceeded || b.Image != "reg/o/tools@sha256:ab" || b.TemplateID != "t1" {
		t.Fatalf("succeeded: %+v %v", b, err)
	}
}

// TestSDKBuildTemplateCancel: when ctx ends while following, the build is cancelled
// (unless LeaveRunning).
func TestSDKBuildTemplateCancel(t *testing.T) {
	for _, leave := range []bool{false, true} {
		srv, c := newBuildServer(t)
		srv.Log = buildEvents()[:3] // stays RUNNING
		dir := writeTree(t, map[string]string{"Dockerfile": "FROM busybox\n"})
		ctx, cancel := context.WithCancel(context.Background())
		b, err := c.BuildTemplate(ctx, "tools", dir, BuildTemplateOptions{LeaveRunning: leave, OnEvent: func(e BuildEvent) error {
			if e.Seq == 3 {
				cancel()
			}
			return nil
		}})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("leave=%v: err %v", leave, err)
		}
		id := srv.Starts[0].GetRequestId()
		if leave {
			if len(srv.Cancels) != 0 || srv.Build("build-"+id).GetState() != buildv1.BuildState_BUILD_STATE_RUNNING {
				t.Errorf("LeaveRunning: cancels %v", srv.Cancels)
			}
			continue
		}
		if !slices.Equal(srv.Cancels, []string{"build-" + id}) || b.State != BuildCancelled {
			t.Errorf("cancels %v, build %+v", srv.Cancels, b)
		}
	}
}
