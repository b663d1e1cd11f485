package image_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestPullProgress (issue 24 §6): a pull from a real (loopback) registry into a fresh
// store counts each layer's bytes into the caller's tracker: while the top layer's blob
// is held back the base layer is complete and the top one is not; at the end every
// layer is complete with its manifest size, named by its short digest. A second caller
// joining the same pull sees the same progress; a cached pull adds none.
func TestPullProgress(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	img := smallImage(t, "progress")
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var digests []string
	var sizes []int64
	for _, l := range layers {
		d, _ := l.Digest()
		n, _ := l.Size()
		digests, sizes = append(digests, d.String()), append(sizes, n)
	}
	release := make(chan struct{})
	host := startRegistry(t, testimage.RegistryOptions{OnRequest: func(r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+digests[1]) {
			<-release
		}
	}})
	ref := host + "/x/progress:1"
	if _, err := testimage.Push(host, "x/progress:1", img); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, image.Options{}) // fresh: nothing cached

	tr, tr2 := progress.NewTracker(progress.PhasePullingImage), progress.NewTracker(progress.PhasePullingImage)
	errs := make(chan error, 2)
	go func() { _, err := s.Pull(progress.With(ctx, tr), ref, nil); errs <- err }()

	// Held back: the base layer completes, the top one waits.
	var mid progress.Snapshot
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		mid = tr.Snapshot()
		if len(mid.Pulls) == 1 && mid.Pulls[0].LayersDone == 1 {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("no layer completed: %+v", mid)
		}
	}
	go func() { _, err := s.Pull(progress.With(ctx, tr2), ref, nil); errs <- err }() // joins the pull under way
	p := mid.Pulls[0]
	if p.Image != ref || p.LayersTotal != 2 || p.BytesTotal != sizes[0]+sizes[1] || len(p.Layers) != 2 {
		t.Fatalf("mid-pull %+v, want %s with 2 layers of %v bytes", p, ref, sizes)
	}
	if l := p.Layers[0]; !l.Complete || l.Done != sizes[0] || l.Total != sizes[0] || l.Digest != progress.ShortDigest(digests[0]) || len(l.Digest) != 12 {
		t.Errorf("base layer mid-pull %+v, want complete %d bytes named %s", l, sizes[0], digests[0][7:19])
	}
	if l := p.Layers[1]; l.Complete || l.Done != 0 || l.Total != sizes[1] {
		t.Errorf("top layer mid-pull %+v, want 0 of %d", l, sizes[1])
	}
	for deadline := time.Now().Add(time.Minute); len(tr2.Snapshot().Pulls) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the second caller sees no pull")
		}
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, tk := range []*progress.Tracker{tr, tr2} {
		end := tk.Snapshot()
		if len(end.Pulls) != 1 {
			t.Fatalf("pulls %+v, want 1", end.Pulls)
		}
		e := end.Pulls[0]
		if e.LayersDone != 2 || e.BytesDone != sizes[0]+sizes[1] || e.BytesDone != e.BytesTotal {
			t.Errorf("after the pull %+v, want 2/2 layers, %d bytes", e, sizes[0]+sizes[1])
		}
	}
	// Cached: nothing pulled, nothing shown.
	tr3 := progress.NewTracker(progress.PhasePullingImage)
	if _, err := s.Pull(progress.With(ctx, tr3), ref, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(tr3.Snapshot().Pulls); n != 0 {
		t.Errorf("a cached pull shows %d pulls", n)
	}
}

// TestPullProgressBounded: a pull lists at most MaxLayers layers, the incomplete ones
// first, while its counts cover every layer.
func TestPullProgressBounded(t *testing.T) {
	n := progress.MaxLayers + 5
	p := progress.NewPull("img")
	var ds []string
	var sizes []int64
	for i := range n {
		ds = append(ds, "sha256:"+strings.Repeat(string(rune('a'+i%6)), 64))
		sizes = append(sizes, 10)
	}
	p.SetLayers(ds, sizes)
	for i := range 8 {
		p.Add(i, 10)
		p.Complete(i)
	}
	p.Add(9, 4)
	p.Add(9, 100) // a registry sending more than the manifest said is clipped
	s := p.Snapshot()
	if s.LayersTotal != n || s.LayersDone != 8 || s.BytesTotal != int64(10*n) || s.BytesDone != 90 {
		t.Fatalf("%+v", s)
	}
	if len(s.Layers) != progress.MaxLayers {
		t.Fatalf("%d layers listed, want %d", len(s.Layers), progress.MaxLayers)
	}
	complete := 0
	for _, l := range s.Layers {
		if l.Complete {
			complete++
		}
	}
	if complete != progress.MaxLayers-(n-8) {
		t.Errorf("%d complete layers listed, want the %d incomplete ones first", complete, n-8)
	}
}
