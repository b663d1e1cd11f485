package e2e

import (
	"crypto/rand"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestSbxRunShowsPullProgress (issue 24 §6): sbx run (stderr not a terminal) of an
// image the runner has not cached says, once the pull is done, which image it pulled,
// how many layers and how many bytes: the pull's progress travelled from the runner's
// image store through the gateway's WatchSandboxProgress to the CLI. The image is new
// (busybox plus a random layer of its own, pushed for this test), so no cache has it.
// Run again, the image is cached: no pull is shown. With -q nothing is shown.
func TestSbxRunShowsPullProgress(t *testing.T) {
	g := startGateway(t)
	imgs, err := testimage.StandardImages()
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 3<<20) // random: gzip keeps its size
	_, _ = rand.Read(junk)
	extra, err := testimage.LayerFromFiles(map[string][]byte{"junk": junk})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(imgs.Busybox, extra)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.Push(env.Registry, "sandboxd/progress:e2e", img); err != nil {
		t.Fatal(err)
	}
	ref := env.Registry + "/sandboxd/progress:e2e"

	out, errs, code := sbx(g, "", "run", "--rm", ref, "--", "echo", "ok")
	if code != 0 || out != "ok\n" {
		t.Fatalf("run: %d %q %q", code, out, errs)
	}
	line := ""
	for _, l := range strings.Split(errs, "\n") {
		if strings.Contains(l, ": pulled image "+ref+": 2 layers, ") {
			line = l
		}
	}
	if !strings.HasPrefix(line, "sbx: sandbox ") || !strings.Contains(line, " MB in ") {
		t.Fatalf("run of an uncached image: stderr %q, want a line \"sbx: sandbox ID: pulled image %s: 2 layers, N MB in Ts\"", errs, ref)
	}
	// 3 MiB of random bytes in the top layer: at least 3.1 MB pulled.
	if !strings.Contains(line, "2 layers, 3.") && !strings.Contains(line, "2 layers, 4.") {
		t.Errorf("pull summary %q: want about 3-4 MB", line)
	}
	t.Log(line)

	_, errs, code = sbx(g, "", "run", "--rm", ref, "--", "true")
	if code != 0 || strings.Contains(errs, "pulled image") {
		t.Errorf("run of a cached image: %d stderr %q, want no pull", code, errs)
	}
	if _, errs, code := sbx(g, "", "run", "-q", "--rm", ref, "--", "true"); code != 0 || errs != "" {
		t.Errorf("run -q: %d stderr %q", code, errs)
	}
}
