package gateway

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ctxFile is an entry of a test build context tar.
type ctxFile struct {
	name, data, link string
	typ              byte
}

// contextTarOf is a tar of files (regular unless typ says), gzip-compressed when gz.
func contextTarOf(t *testing.T, gz bool, files ...ctxFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Typeflag: f.typ, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Linkname: f.link}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.data)); h.Size > 0 && err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if !gz {
		return buf.Bytes()
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(buf.Bytes())
	_ = zw.Close()
	return z.Bytes()
}

// extractContext unpacks a build's context (an fsarchive archive) into a new directory.
func extractContext(t *testing.T, data []byte) string {
	t.Helper()
	dir := t.TempDir()
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := fsarchive.Extract(context.Background(), bytes.NewReader(data), root, runtime.ArchiveLimits{MaxFiles: MaxBuildContextFiles}, fsarchive.IDMap{}); err != nil {
		t.Fatalf("the build context is no fsarchive archive: %v", err)
	}
	return dir
}

// TestComposeBuildContexts: build_contexts[service] (a tar, plain or gzip) is the
// build's context, its Dockerfile at build.dockerfile; the same context again builds
// nothing, a changed one builds again; an inline Dockerfile joins the context under a
// name the context does not use.
func TestComposeBuildContexts(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	e := newBuildEnv(t, t.TempDir(), nil, r)
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url)
	const file = "services: {app: {build: {context: ., dockerfile: docker/Dockerfile.x}, command: [sleep, inf]}}"
	withContext := func(contents string, tarBytes []byte) *sandboxv1.CreateSandboxFromFileRequest {
		m := fileReq(contents)
		m.BuildContexts = map[string][]byte{"app": tarBytes}
		return m
	}
	v1 := []ctxFile{{name: "./"}, {name: "docker/Dockerfile.x", data: "FROM busybox\nCOPY hello.txt /hello.txt\n"}, {name: "hello.txt", data: "v1"}}
	v1[0].typ = tar.TypeDir

	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, withContext(file, contextTarOf(t, true, v1...)))); err != nil {
		t.Fatal(err)
	}
	reqs, contexts := r.requests()
	if len(reqs) != 1 || reqs[0].Options.Dockerfile != "docker/Dockerfile.x" {
		t.Fatalf("builds %+v", reqs)
	}
	dir := extractContext(t, contexts[0])
	if b, err := os.ReadFile(filepath.Join(dir, "hello.txt")); err != nil || string(b) != "v1" {
		t.Errorf("hello.txt in the build's context: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "docker/Dockerfile.x")); err != nil || !strings.Contains(string(b), "COPY hello.txt") {
		t.Errorf("the Dockerfile in the build's context: %q %v", b, err)
	}
	// The same context (sent plain this time: the same tree) builds nothing.
	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, withContext(file, contextTarOf(t, false, v1...)))); err != nil {
		t.Fatal(err)
	}
	if reqs, _ := r.requests(); len(reqs) != 1 {
		t.Errorf("an unchanged context was built again: %d builds", len(reqs))
	}
	// A changed file builds again, into another tag.
	v2 := append([]ctxFile(nil), v1...)
	v2[2].data = "v2"
	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, withContext(file, contextTarOf(t, true, v2...)))); err != nil {
		t.Fatal(err)
	}
	reqs, contexts = r.requests()
	if len(reqs) != 2 || reqs[1].Push == reqs[0].Push {
		t.Fatalf("a changed context: builds %d, pushes %q", len(reqs), []string{reqs[0].Push, reqs[len(reqs)-1].Push})
	}
	if b, _ := os.ReadFile(filepath.Join(extractContext(t, contexts[1]), "hello.txt")); string(b) != "v2" {
		t.Errorf("the rebuild's hello.txt: %q", b)
	}

	// An inline Dockerfile with a context: added under a name the context does not use.
	inline := "services: {app: {build: {dockerfile_inline: \"FROM busybox\\nCOPY . /src\\n\"}, command: [sleep, inf]}}"
	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, withContext(inline, contextTarOf(t, false, ctxFile{name: inlineDockerfileName, data: "mine"}, ctxFile{name: "a", data: "A"})))); err != nil {
		t.Fatal(err)
	}
	reqs, contexts = r.requests()
	last := len(reqs) - 1
	if want := inlineDockerfileName + "-1"; reqs[last].Options.Dockerfile != want {
		t.Fatalf("the inline Dockerfile is %q, want %q", reqs[last].Options.Dockerfile, want)
	}
	dir = extractContext(t, contexts[last])
	for name, want := range map[string]string{inlineDockerfileName + "-1": "FROM busybox\nCOPY . /src\n", inlineDockerfileName: "mine", "a": "A"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", name, b, err, want)
		}
	}
}

// Every refusal of a context is INVALID_ARGUMENT naming build_contexts[service], the
// entry and why; nothing is built.
func TestComposeBuildContextRefusals(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	e := newBuildEnv(t, t.TempDir(), func(o *BuildOptions) { o.MaxContextBytes = 64 << 10 }, r)
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url)
	df := ctxFile{name: "Dockerfile", data: "FROM busybox\n"}
	for _, tc := range []struct {
		name, file string
		tar        []byte
		field      string
		want       string
	}{
		{"traversal", "services: {app: {build: .}}", contextTarOf(t, false, df, ctxFile{name: "../../etc/cron.d/x", data: "evil"}), "build_contexts[app]", `"../../etc/cron.d/x": path leaves the root`},
		{"absolute", "services: {app: {build: .}}", contextTarOf(t, true, df, ctxFile{name: "/etc/passwd", data: "evil"}), "build_contexts[app]", `"/etc/passwd": absolute path`},
		{"hard link", "services: {app: {build: .}}", contextTarOf(t, false, df, ctxFile{name: "h", typ: tar.TypeLink, link: "/etc/shadow"}), "build_contexts[app]", `"h": a hard link`},
		{"device", "services: {app: {build: .}}", contextTarOf(t, false, df, ctxFile{name: "null", typ: tar.TypeChar}), "build_contexts[app]", `"null": a device node`},
		{"fifo", "services: {app: {build: .}}", contextTarOf(t, false, df, ctxFile{name: "p", typ: tar.TypeFifo}), "build_contexts[app]", `"p": a fifo`},
		{"duplicate", "services: {app: {build: .}}", contextTarOf(t, false, df, ctxFile{name: "./Dockerfile", data: "FROM evil"}), "build_contexts[app]", "a second entry"},
		{"below a symlink", "services: {app: {build: .}}", contextTarOf(t, false, df, ctxFile{name: "l", typ: tar.TypeSymlink, link: "/etc"}, ctxFile{name: "l/x", data: "x"}), "build_contexts[app]", `below "l"`},
		{"no Dockerfile", "services: {app: {build: {context: ., dockerfile: Dockerfile.x}}}", contextTarOf(t, false, df), "build_contexts[app]", `has no "Dockerfile.x"`},
		{"Dockerfile a symlink", "services: {app: {build: .}}", contextTarOf(t, false, ctxFile{name: "Dockerfile", typ: tar.TypeSymlink, link: "/etc/passwd"}), "build_contexts[app]", "is a symlink"},
		{"Dockerfile a directory", "services: {app: {build: .}}", contextTarOf(t, false, ctxFile{name: "Dockerfile/x", data: "x"}), "build_contexts[app]", "is a directory"},
		{"not a tar", "services: {app: {build: .}}", []byte(strings.Repeat("not a tar ", 100)), "build_contexts[app]", "tar"},
		{"too large as sent", "services: {app: {build: .}}", contextTarOf(t, false, df, ctxFile{name: "big", data: strings.Repeat("x", 70<<10)}), "build_contexts[app]", "at most 65536"},
		{"gzip bomb", "services: {app: {build: .}}", contextTarOf(t, true, df, ctxFile{name: "zeros", data: strings.Repeat("\x00", 1<<20)}), "build_contexts[app]", "more than 65536 bytes"},
		{"key of no service", "services: {app: {build: .}}", nil, "build_contexts[other]", "nothing to build"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fileReq(tc.file)
			m.BuildContexts = map[string][]byte{"app": tc.tar}
			if tc.tar == nil {
				m.BuildContexts = map[string][]byte{"app": contextTarOf(t, false, df), "other": contextTarOf(t, false, df)}
			}
			_, err := sc.CreateSandboxFromFile(ctx, as(e.user, m))
			wantBuildErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, tc.field)
			for _, v := range apierr.Violations(err) {
				if v.Field == tc.field && !strings.Contains(v.Description, tc.want) {
					t.Errorf("violation %s: %q, want it to say %q", v.Field, v.Description, tc.want)
				}
			}
			if reqs, _ := r.requests(); len(reqs) != 0 {
				t.Errorf("%d builds made", len(reqs))
			}
		})
	}
}

// A bad context is INVALID_ARGUMENT even where nothing builds (the request is checked
// before the gateway says it cannot build).
func TestComposeBuildContextCheckedWithoutBuilds(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	m := fileReq("services: {app: {build: .}}")
	m.BuildContexts = map[string][]byte{"app": contextTarOf(t, false, ctxFile{name: "Dockerfile", data: "FROM x"}, ctxFile{name: "../x", data: "x"})}
	_, err := s.CreateSandboxFromFile(tmplUser(testOrg), connect.NewRequest(m))
	wantBuildErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "build_contexts[app]")
}
