package sbxcli

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/types/known/timestamppb"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/buildfake"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// contextDir is a build context with a Dockerfile, a .dockerignore and a symlink.
func contextDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"Dockerfile":    "FROM debian:bookworm\nRUN apt-get update\n",
		".dockerignore": "*.tmp\nsecrets/\n",
		"app.py":        "print(1)\n",
		"junk.tmp":      "x",
		"secrets/key":   "k",
		"docker/alt":    "FROM scratch\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// contextNames lists the entries of a context archive (a symlink as name->target).
func contextNames(t *testing.T, data []byte) []string {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		name := h.Name
		if h.Typeflag == tar.TypeSymlink {
			name += "->" + h.Linkname
		}
		out = append(out, name)
	}
}

var (
	stdoutStream = buildv1.LogLine_STREAM_STDOUT
	running      = buildv1.BuildState_BUILD_STATE_RUNNING
)

func failingLog() []*buildv1.BuildLogEvent {
	return []*buildv1.BuildLogEvent{
		buildfake.Final(&buildv1.Build{State: running, TotalSteps: 3}),
		buildfake.Step(1, "FROM debian:bookworm", true),
		buildfake.Step(2, "COPY . /app", true),
		buildfake.Step(3, "RUN apt-get update", false),
		buildfake.Line(3, stdoutStream, "E: Unable to locate package nope"),
		buildfake.Final(&buildv1.Build{State: buildv1.BuildState_BUILD_STATE_FAILED, TotalSteps: 3,
			FailedStep:    &buildv1.BuildStep{Number: 3, Instruction: "RUN apt-get update"},
			FailureReason: "BuildStepFailed", FailureMessage: "exit status 100"}),
	}
}

func succeedingLog() []*buildv1.BuildLogEvent {
	log := failingLog()[:5]
	return append(log, buildfake.Final(&buildv1.Build{State: buildv1.BuildState_BUILD_STATE_SUCCEEDED, TotalSteps: 3,
		TemplateId: "tmpl-1", TemplateRevision: 2, Image: "reg.example/org/py@sha256:abc",
		StartTime: timestamppb.Now(), EndTime: timestamppb.Now()}))
}

// TestSbxTemplateBuild: the context is packed as .dockerignore says (symlink kept as a
// symlink), the flags reach the request, steps print as "Step n/m: … (cached)", and a
// failing step exits 1 naming it.
func TestSbxTemplateBuild(t *testing.T) {
	f := newFake(t)
	dir := contextDir(t)
	f.builds.Log = failingLog()
	t.Setenv("FROM_ENV", "e")
	out, errs, code := f.sbx("", "template", "build", dir, "--name", "py", "--build-arg", "A=1", "--build-arg", "FROM_ENV",
		"--target", "final", "--no-cache", "--timeout", "90s", "--builder-size", "large")
	if code != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if !strings.Contains(errs, "sbx: build build-") || !strings.Contains(errs, "failed at step 3/3 (RUN apt-get update): BuildStepFailed: exit status 100") {
		t.Errorf("stderr %q", errs)
	}
	for _, want := range []string{"Sending build context: 7 entries", "queued (template py)\n",
		"Step 1/3: FROM debian:bookworm (cached)\nStep 2/3: COPY . /app (cached)\nStep 3/3: RUN apt-get update\nE: Unable to locate package nope\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout %q lacks %q", out, want)
		}
	}
	req := f.builds.Starts[0]
	if req.GetTemplate() != "py" || req.GetDockerfile() != "Dockerfile" || req.GetTargetStage() != "final" || !req.GetNoCache() ||
		req.GetTimeoutSeconds() != 90 || req.GetBuilderSize() != "large" || req.GetBuildArgs()["A"] != "1" || req.GetBuildArgs()["FROM_ENV"] != "e" {
		t.Errorf("request %v", req)
	}
	names := contextNames(t, req.GetContext())
	if want := []string{"./", ".dockerignore", "Dockerfile", "app.py", "docker/", "docker/alt", "passwd->/etc/passwd"}; !slices.Equal(names, want) {
		t.Errorf("context %q, want %q", names, want)
	}

	// Success, -f inside DIR given relative to the working directory, -o json.
	f.builds.Log = succeedingLog()
	t.Chdir(dir)
	out, errs, code = f.sbx("", "-o", "json", "template", "build", "-f", "docker/alt", ".", "--name", "py")
	if code != 0 {
		t.Fatalf("exit %d, %q %q", code, out, errs)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || got["state"] != "BUILD_STATE_SUCCEEDED" || got["image"] != "reg.example/org/py@sha256:abc" {
		t.Errorf("json stdout %q: %v", out, err)
	}
	if !strings.Contains(errs, "Step 3/3: RUN apt-get update") {
		t.Errorf("progress is not on stderr with -o json: %q", errs)
	}
	if f.builds.Starts[1].GetDockerfile() != "docker/alt" {
		t.Errorf("dockerfile %q", f.builds.Starts[1].GetDockerfile())
	}
	out, _, code = f.sbx("", "template", "build", ".", "--name", "py")
	if code != 0 || !strings.Contains(out, "succeeded in 0s (0 of 0 steps from the layer cache): reg.example/org/py@sha256:abc (template py revision 2)") {
		t.Errorf("text success: %d %q", code, out)
	}

	// Refused before anything is sent.
	n := len(f.builds.Starts)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-f", "../x", ".", "--name", "py"}, "must be inside the context directory"},
		{[]string{".", "--name", "py", "--build-arg", "1X=2"}, "must match"},
		{[]string{".", "--name", "py", "--build-arg", "A=1", "--build-arg", "A=2"}, "given twice"},
		{[]string{".", "--name", "py", "--build-arg", "SBX_SURELY_UNSET_VAR"}, "is not set"},
		{[]string{"Dockerfile", "--name", "py"}, "not a directory"},
		{[]string{"."}, `"name" not set`},
		{[]string{"-f", "app.py/x", ".", "--name", "py"}, "no Dockerfile"},
	} {
		_, errs, code := f.sbx("", append([]string{"template", "build"}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, %q", tc.args, code, errs)
		}
	}
	if len(f.builds.Starts) != n {
		t.Errorf("refused builds reached the server")
	}
}

// TestSbxTemplateBuildInterrupt: Ctrl-C while following cancels the build; with
// --detach the build is only started and its ID printed.
func TestSbxTemplateBuildInterrupt(t *testing.T) {
	f := newFake(t)
	dir := contextDir(t)
	f.builds.Log = failingLog()[:4] // stays RUNNING
	f.builds.Following = make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-f.builds.Following
		cancel()
	}()
	out, errs, code := f.run(ctx, "", "template", "build", dir, "--name", "py")
	if code != 130 {
		t.Fatalf("exit %d, %q %q", code, out, errs)
	}
	id := "build-" + f.builds.Starts[0].GetRequestId()
	if !slices.Equal(f.builds.Cancels, []string{id}) || f.builds.Build(id).GetState() != buildv1.BuildState_BUILD_STATE_CANCELLED {
		t.Errorf("cancels %v", f.builds.Cancels)
	}
	if !strings.Contains(errs, "sbx: build "+id+" cancelled\nsbx: interrupted\n") || !strings.Contains(out, "queued (template py)") {
		t.Errorf("stdout %q, stderr %q", out, errs)
	}

	out, errs, code = f.sbx("", "template", "build", dir, "--name", "py", "--detach")
	id = "build-" + f.builds.Starts[1].GetRequestId()
	if code != 0 || !strings.HasSuffix(out, id+"\n") || len(f.builds.Cancels) != 1 || len(f.builds.LogReqs) != 1 {
		t.Errorf("detach: %d %q %q, cancels %v", code, out, errs, f.builds.Cancels)
	}
}

func TestSbxBuildCommands(t *testing.T) {
	f := newFake(t)
	f.builds.PageSize = 1
	f.builds.Add(&buildv1.Build{BuildId: "b1", State: buildv1.BuildState_BUILD_STATE_SUCCEEDED, Target: &buildv1.Build_Template{Template: "py"},
		TotalSteps: 2, Steps: []*buildv1.BuildStep{{Number: 1, Instruction: "FROM busybox", Cached: true}, {Number: 2, Instruction: "RUN true"}},
		Image: "reg/o/py@sha256:1", TemplateId: "t1", TemplateRevision: 3, CreateTime: timestamppb.Now()},
		buildfake.Step(1, "FROM busybox", true), buildfake.Line(1, stdoutStream, "pulled"))
	f.builds.Add(&buildv1.Build{BuildId: "b2", State: buildv1.BuildState_BUILD_STATE_FAILED, Target: &buildv1.Build_Repository{Repository: "tools:1"},
		FailedStep: &buildv1.BuildStep{Number: 1, Instruction: "FROM nope"}, FailureReason: "BuildStepFailed"},
		buildfake.Final(&buildv1.Build{BuildId: "b2", State: buildv1.BuildState_BUILD_STATE_FAILED, FailedStep: &buildv1.BuildStep{Number: 1, Instruction: "FROM nope"}, FailureReason: "BuildStepFailed"}))
	f.builds.Add(&buildv1.Build{BuildId: "b3", State: running, Target: &buildv1.Build_Template{Template: "other"}})

	out, errs, code := f.sbx("", "build", "ls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 4 || !strings.HasPrefix(lines[1], "b3 ") || !strings.Contains(lines[3], "template py") || !strings.Contains(lines[3], "2/2") {
		t.Fatalf("ls: %d %q %q", code, out, errs)
	}
	out, _, code = f.sbx("", "-o", "json", "build", "ls", "--template", "py")
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 || len(list) != 1 || list[0]["buildId"] != "b1" {
		t.Fatalf("ls json: %q %v", out, err)
	}

	out, _, code = f.sbx("", "build", "get", "b1")
	for _, want := range []string{"State:", "succeeded", "Template:", "t1 (revision 3)", "Steps:\nStep 1/2: FROM busybox (cached)\nStep 2/2: RUN true\n"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("get lacks %q: %q", want, out)
		}
	}
	out, _, code = f.sbx("", "build", "get", "b2")
	if code != 0 || !strings.Contains(out, "Failed step:") || !strings.Contains(out, "1: FROM nope") {
		t.Errorf("get failed: %q", out)
	}
	_, errs, code = f.sbx("", "build", "get", "nope")
	if code != 1 || !strings.Contains(errs, "CWSANDBOX_BUILD_NOT_FOUND") {
		t.Errorf("get missing: %d %q", code, errs)
	}

	out, _, code = f.sbx("", "build", "logs", "b1")
	if code != 0 || out != "Step 1: FROM busybox (cached)\npulled\n" {
		t.Errorf("logs: %d %q", code, out)
	}
	out, _, code = f.sbx("", "-o", "json", "build", "logs", "b1")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 || !strings.Contains(lines[1], `"text":"pulled"`) {
		t.Errorf("logs json: %d %q", code, out)
	}
	out, errs, code = f.sbx("", "build", "logs", "-f", "b2")
	if code != 1 || !strings.Contains(errs, "failed at step 1 (FROM nope)") {
		t.Errorf("logs -f of a failed build: %d %q %q", code, out, errs)
	}

	out, _, code = f.sbx("", "build", "cancel", "b3")
	if code != 0 || out != "b3 cancelled\n" || !slices.Equal(f.builds.Cancels, []string{"b3"}) {
		t.Errorf("cancel: %d %q", code, out)
	}
	out, _, code = f.sbx("", "-o", "json", "build", "cancel", "b3")
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 || got["state"] != "BUILD_STATE_CANCELLED" {
		t.Errorf("cancel json: %d %q", code, out)
	}
}

// TestBuildProgressStepHeader: the builder's own header of the step just printed is not
// printed again, and gives the total; other lines are printed as they are.
func TestBuildProgressStepHeader(t *testing.T) {
	var b strings.Builder
	p := &buildProgress{w: &b}
	for _, e := range []sandbox.BuildEvent{
		{Step: &sandbox.BuildStep{Number: 1, Instruction: "FROM busybox"}},
		{Line: &sandbox.BuildLogLine{Text: "STEP 1/2: FROM busybox"}},
		{Step: &sandbox.BuildStep{Number: 2, Instruction: "RUN echo hi"}},
		{Line: &sandbox.BuildLogLine{Text: "STEP 2/2: RUN echo other"}},
		{Line: &sandbox.BuildLogLine{Text: "hi"}},
	} {
		if err := p.event(e); err != nil {
			t.Fatal(err)
		}
	}
	want := "Step 1: FROM busybox\nStep 2/2: RUN echo hi\nSTEP 2/2: RUN echo other\nhi\n"
	if b.String() != want {
		t.Errorf("progress = %q, want %q", b.String(), want)
	}
}
