package registry

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/reference"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
)

// ageStorage makes everything the filesystem storage holds two hours old.
func ageStorage(t *testing.T, f *fixture) {
	t.Helper()
	old := time.Now().Add(-2 * time.Hour)
	err := filepath.Walk(f.reg.cfg.Dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, old, old)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// pullAll pulls ref's manifest, config and every layer.
func pullAll(f *fixture, ref string) error {
	r, err := parseRef(f, ref)
	if err != nil {
		return err
	}
	img, err := remote.Image(r, basic(userA))
	if err != nil {
		return err
	}
	if _, err := img.RawConfigFile(); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		_ = rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func blobsOf(t *testing.T, img v1.Image) []string {
	t.Helper()
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	out := []string{cfg.String()}
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		out = append(out, d.String())
	}
	return out
}

func pushImage(t *testing.T, f *fixture, repo string, img v1.Image) {
	t.Helper()
	if err := remote.Write(f.ref(t, repo), img, basic(adminA)); err != nil {
		t.Fatalf("push %s: %v", repo, err)
	}
}

// TestGCCollectsUnreferenced: an image no reference names goes (its manifest answers 404
// and the blobs only it used are deleted); the referenced ones (by digest, by tag) pull
// whole, with the layers they share with the collected one.
func TestGCCollectsUnreferenced(t *testing.T) {
	f := newFixture(t, Config{})
	kept, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	extra, _ := random.Layer(512, "application/vnd.oci.image.layer.v1.tar+gzip")
	gone, err := mutate.AppendLayers(kept, extra) // shares kept's layers
	if err != nil {
		t.Fatal(err)
	}
	pushImage(t, f, "org-a/app:kept", kept)
	pushImage(t, f, "org-a/app:gone", gone)
	byTag := push(t, f, "org-a/lib:v1", basic(adminA))
	goneToo := push(t, f, "org-a/lib:v2", basic(adminA))
	latest := push(t, f, "org-a/base", basic(adminA)) // :latest

	var refs References
	refs.Add(f.host + "/org-a/app@" + digestOf(t, kept))
	refs.Scan("services:\n  x:\n    image: " + f.host + "/org-a/lib:v1\n") // free text
	refs.Add(f.host + "/org-a/base")
	f.now = time.Now().Add(2 * DefaultGCGrace) // every push is past the grace
	res, err := f.reg.GC(context.Background(), GCOptions{Keep: refs.Keep})
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifests != 2 {
		t.Errorf("deleted %d manifests, want 2 (%+v)", res.Manifests, res)
	}
	for _, ref := range []string{"org-a/app:kept", "org-a/app@" + digestOf(t, kept), "org-a/lib:v1", "org-a/base:latest"} {
		if err := pullAll(f, ref); err != nil {
			t.Errorf("kept %s: %v", ref, err)
		}
	}
	for _, ref := range []string{"org-a/app:gone", "org-a/app@" + digestOf(t, gone), "org-a/lib:v2", "org-a/lib@" + digestOf(t, goneToo)} {
		if err := pullAll(f, ref); status(err) != http.StatusNotFound {
			t.Errorf("collected %s: %v, want 404", ref, err)
		}
	}
	shared := map[string]bool{}
	for _, img := range []v1.Image{kept, byTag, latest} {
		for _, b := range blobsOf(t, img) {
			shared[b] = true
			if !blobOnDisk(t, f, b) {
				t.Errorf("blob %s of a kept image deleted", b)
			}
		}
	}
	for _, img := range []v1.Image{gone, goneToo} {
		for _, b := range append(blobsOf(t, img), digestOf(t, img)) {
			if !shared[b] && blobOnDisk(t, f, b) {
				t.Errorf("blob %s of a collected image still stored", b)
			}
		}
	}
	// A second pass finds nothing more.
	if res, err := f.reg.GC(context.Background(), GCOptions{Keep: refs.Keep}); err != nil || res != (GCResult{}) {
		t.Errorf("second pass: %+v, %v", res, err)
	}
}

// TestGCGrace: what was pushed within the grace stays, referenced or not.
func TestGCGrace(t *testing.T) {
	f := newFixture(t, Config{})
	img := push(t, f, "org-a/app:new", basic(adminA))
	res, err := f.reg.GC(context.Background(), GCOptions{Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res != (GCResult{}) {
		t.Errorf("young image collected: %+v", res)
	}
	if err := pullAll(f, "org-a/app@"+digestOf(t, img)); err != nil {
		t.Fatal(err)
	}
}

// TestGCDuringPush: a push's blobs are uploaded, a pass runs before its manifest is
// put (Distribution's own sweep would delete those unreferenced blobs), the manifest
// put succeeds and the image pulls whole; the old unreferenced image is collected.
func TestGCDuringPush(t *testing.T) {
	f := newFixture(t, Config{})
	old := push(t, f, "org-a/app:old", basic(adminA))
	ageStorage(t, f)
	img, err := random.Image(512, 3)
	if err != nil {
		t.Fatal(err)
	}
	repo := f.ref(t, "org-a/app:new").Context()
	layers, _ := img.Layers()
	for _, l := range layers {
		if err := remote.WriteLayer(repo, l, basic(adminA)); err != nil {
			t.Fatal(err)
		}
	}
	f.now = time.Now()
	res, err := f.reg.GC(context.Background(), GCOptions{Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifests != 1 {
		t.Errorf("deleted %d manifests, want the old one (%+v)", res.Manifests, res)
	}
	for _, l := range layers {
		d, _ := l.Digest()
		if !blobOnDisk(t, f, d.String()) {
			t.Errorf("uploaded layer %s deleted before its manifest", d)
		}
	}
	pushImage(t, f, "org-a/app:new", img) // the config and manifest
	if err := pullAll(f, "org-a/app:new"); err != nil {
		t.Fatalf("image pushed across a pass: %v", err)
	}
	if err := pullAll(f, "org-a/app@"+digestOf(t, old)); status(err) != http.StatusNotFound {
		t.Errorf("old image: %v, want 404", err)
	}
}

// TestGCConcurrentPushes runs passes in a loop while images are pushed: every push
// succeeds and pulls whole afterwards, and the old image is collected.
func TestGCConcurrentPushes(t *testing.T) {
	f := newFixture(t, Config{})
	old := push(t, f, "org-a/old:v1", basic(adminA))
	ageStorage(t, f)
	f.now = time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	passes := 0
	gcErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if _, err := f.reg.GC(ctx, GCOptions{Grace: time.Minute}); err != nil && ctx.Err() == nil {
				gcErr <- err
				return
			}
			passes++
		}
	}()
	const n = 6
	imgs := make([]v1.Image, n)
	errs := make([]error, n)
	var pw sync.WaitGroup
	for i := range n {
		pw.Add(1)
		go func() {
			defer pw.Done()
			img, err := random.Image(256, 3)
			if err == nil {
				imgs[i] = img
				var r name.Reference
				if r, err = parseRef(f, fmt.Sprintf("org-a/app%d:v1", i)); err == nil {
					err = remote.Write(r, img, basic(adminA))
				}
			}
			errs[i] = err
		}()
	}
	pw.Wait()
	cancel()
	wg.Wait()
	select {
	case err := <-gcErr:
		t.Fatalf("gc during pushes: %v", err)
	default:
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("push %d during gc: %v", i, err)
		}
	}
	// A last pass with no pushes: the young images stay whole, the old one is gone.
	if _, err := f.reg.GC(context.Background(), GCOptions{Grace: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := pullAll(f, fmt.Sprintf("org-a/app%d:v1", i)); err != nil {
			t.Errorf("image %d pushed during gc: %v", i, err)
		}
	}
	if err := pullAll(f, "org-a/old@"+digestOf(t, old)); status(err) != http.StatusNotFound {
		t.Errorf("old image: %v, want 404", err)
	}
	t.Logf("%d passes ran during the pushes", passes)
}

// TestReferences: what References.Add and Scan accept and what Keep keeps.
func TestReferences(t *testing.T) {
	var rs References
	d := digest.FromString("x")
	if !rs.Add("reg.example:5000/org-a/app@" + d.String()) {
		t.Fatal("digest reference refused")
	}
	if rs.Add("not a reference") || rs.Add("UPPER/Case") {
		t.Error("a non-reference accepted")
	}
	if n := rs.Scan(`{"image":"h:1/org-b/web:v2","cmd":["sh","-c","echo a/b:"]}`); n != 2 {
		t.Errorf("scan found %d references, want 2 (h:1/org-b/web:v2, a/b)", n)
	}
	for _, c := range []struct {
		org, repo string
		d         digest.Digest
		tags      []string
		want      bool
	}{
		{"org-a", "app", d, nil, true},
		{"org-a", "app", digest.FromString("y"), []string{"v1"}, false},
		{"org-b", "web", digest.FromString("y"), []string{"v1", "v2"}, true},
		{"org-b", "web", d, nil, false},
		{"a", "b", digest.FromString("z"), []string{"latest"}, true},
		{"org-c", "app", d, nil, false},
	} {
		if got := rs.Keep(c.org, c.repo, c.d, c.tags); got != c.want {
			t.Errorf("Keep(%s/%s@%s %v) = %v, want %v", c.org, c.repo, c.d, c.tags, got, c.want)
		}
	}
}

func parseRef(f *fixture, ref string) (name.Reference, error) {
	return name.ParseReference(f.host+"/"+ref, name.Insecure)
}

// FuzzReferencesScan: any text scans without panicking; a valid reference to a
// repository whose name is the fuzzed text, alone or inside other text, is found and kept.
func FuzzReferencesScan(f *testing.F) {
	for _, s := range []string{"", "app", "a/b/c", "x.y-z__w", "Bad", "a//b", strings.Repeat("x/", 200),
		"image: r.io/o/n\n", "PATH=/usr/local/sbin:/usr/bin"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		var rs References
		rs.Scan(text)
		ref := "h:1/org-a/" + text + ":v1"
		if _, err := reference.ParseNormalizedNamed(ref); err != nil || len(ref) > maxRefLen {
			return
		}
		var in References
		if in.Scan("services:\n  x:\n    image: "+ref+"\n") == 0 {
			t.Fatalf("%q not found in a Compose file", ref)
		}
		if !in.Keep("org-a", text, digest.FromString("x"), []string{"v1"}) {
			t.Fatalf("%q not kept", ref)
		}
	})
}
