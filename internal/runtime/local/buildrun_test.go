package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestBuildRun drives imagebuild.Run (the runner side of BuildService) against a real
// builder sandbox (gVisor, default capabilities, no network): the context goes in as an
// fsarchive archive, the base image as a docker-archive; the steps are reported as they
// begin, the built image comes back as an OCI layout and is pushed to a registry; a
// rebuild in the same builder takes every step from the cache; a failing RUN is named.
func TestBuildRun(t *testing.T) {
	e := gvisorEnv(t)
	builderTar, err := testimage.BuilderTar()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	imgs, err := testimage.StandardImages()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	testenv.RequireRoot(t, "runsc")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	rootfs := t.TempDir()
	if out, err := exec.Command("tar", "--numeric-owner", "-xpf", builderTar, "-C", rootfs).CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v: %s", builderTar, err, out)
	}
	host, stop, err := testimage.StartRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	b, err := New(Config{OCIRuntime: testOCIRuntime, StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent,
		Images: &buildImages{builder: rootfs}, Runtimes: e.b.cfg.Runtimes})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	if _, err := b.Create(ctx, &runtime.Spec{ID: "bldrun-1", RuntimeClass: GVisorClass,
		Container: runtime.Container{Image: "builder", Command: "sleep", Args: []string{"infinity"},
			Resources: runtime.Resources{MilliCPU: 2000, MemoryBytes: 2 << 30, Pids: 1024}},
	}); err != nil {
		t.Fatalf("create the builder sandbox: %v", err)
	}
	defer func() {
		if err := b.Destroy(context.Background(), "bldrun-1"); err != nil {
			t.Errorf("destroy the builder: %v", err)
		}
	}()
	c := agentClient(b, "bldrun-1")

	dir := t.TempDir()
	for p, content := range map[string]string{"Dockerfile": buildDockerfile, "Dockerfile.fail": buildFailing, "Dockerfile.short": "FROM busybox\nRUN echo short-name-base\n", "hello.txt": "hello-from-context\n"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	var archive bytes.Buffer
	if _, err := fsarchive.Write(ctx, root, &archive, fsarchive.IDMap{}); err != nil {
		t.Fatal(err)
	}

	const busybox = "localhost/sandboxd/busybox:latest"
	tag, err := name.NewTag(busybox)
	if err != nil {
		t.Fatal(err)
	}
	build := func(o imagebuild.Options) (*imagebuild.Result, []imagebuild.Event, time.Duration) {
		t.Helper()
		var events []imagebuild.Event
		start := time.Now()
		res, err := imagebuild.Run(ctx, c, imagebuild.Input{Options: o,
			Context: bytes.NewReader(archive.Bytes()), ContextLimits: runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 100},
			WriteBase: func(_ context.Context, ref string, w io.Writer) error {
				switch ref {
				case busybox:
					return tarball.Write(tag, imgs.Busybox, w)
				case "busybox": // a short name, as the image store's WriteArchive tags it
					short, err := name.NewTag(ref)
					if err != nil {
						return err
					}
					return tarball.Write(short, imgs.Busybox, w)
				}
				return fmt.Errorf("unexpected base %q", ref)
			},
			OutDir: filepath.Join(t.TempDir(), "out"), OutputLimits: runtime.ArchiveLimits{MaxBytes: 256 << 20, MaxFiles: 1000},
			Events: func(ev imagebuild.Event) { events = append(events, ev) },
		})
		if err != nil {
			t.Fatalf("build %+v: %v", o, err)
		}
		return res, events, time.Since(start)
	}

	res, events, took := build(imagebuild.Options{})
	if res.ExitCode != 0 || res.Image == nil {
		t.Fatalf("build: exit %d, image %v\n%s", res.ExitCode, res.Image, eventText(events))
	}
	t.Logf("first build through imagebuild.Run: %v", took)
	var began []int
	for _, ev := range events {
		if ev.Step != nil {
			began = append(began, ev.Step.Number)
		}
	}
	if strings.Join(res.Bases, ",") != busybox {
		t.Errorf("bases %q, want %s", res.Bases, busybox)
	}
	if len(began) != buildSteps+1 || len(res.Steps) != buildSteps+1 || res.Steps[0].Total != buildSteps+1 ||
		!strings.HasPrefix(res.Steps[3].Instruction, "COPY hello.txt") {
		t.Errorf("steps begun %v, result %+v, want %d steps, the 4th the COPY", began, res.Steps, buildSteps+1)
	}
	digest, err := imagebuild.Push(ctx, res.Image, host+"/org-1/built:1", "", "", true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(digest, "sha256:") {
		t.Errorf("pushed digest %q", digest)
	}

	res, events, took = build(imagebuild.Options{})
	cached := 0
	for _, s := range res.Steps {
		if s.Cached {
			cached++
		}
	}
	if res.ExitCode != 0 || cached != buildSteps {
		t.Errorf("rebuild: exit %d, %d steps cached, want all %d\n%s", res.ExitCode, cached, buildSteps, eventText(events))
	}
	t.Logf("rebuild through imagebuild.Run (all cached): %v", took)

	// A short base name (FROM busybox) resolves to the docker-archive handed in, with
	// --pull=never and no unqualified search registries.
	res, events, _ = build(imagebuild.Options{Dockerfile: "Dockerfile.short"})
	if res.ExitCode != 0 || strings.Join(res.Bases, ",") != "busybox" {
		t.Errorf("short base name: exit %d, bases %q\n%s", res.ExitCode, res.Bases, eventText(events))
	}

	res, events, _ = build(imagebuild.Options{Dockerfile: "Dockerfile.fail"})
	if res.ExitCode == 0 || res.Failed == nil || res.Failed.Number != 3 || res.Failed.Instruction != "RUN echo about to fail && exit 7" {
		t.Errorf("failing build: exit %d, failed %+v (%s), want step 3 named\n%s", res.ExitCode, res.Failed, res.Why, eventText(events))
	}
}

func eventText(evs []imagebuild.Event) string {
	var sb strings.Builder
	for _, ev := range evs {
		if ev.Step == nil {
			sb.WriteString(ev.Line + "\n")
		}
	}
	return sb.String()
}
