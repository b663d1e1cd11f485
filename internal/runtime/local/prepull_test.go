package local

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// recordingImages is an image store that records pulls ("ref|password") and fails the
// first fail[ref] pulls of ref.
type recordingImages struct {
	mu    sync.Mutex
	pulls []string
	fail  map[string]int
}

func (r *recordingImages) Pull(_ context.Context, ref string, creds *runtime.Credentials) (*Image, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pw := ""
	if creds != nil {
		pw = creds.Password
	}
	r.pulls = append(r.pulls, ref+"|"+pw)
	if r.fail[ref] > 0 {
		r.fail[ref]--
		return nil, fmt.Errorf("%w: registry down", runtime.ErrRegistry)
	}
	return &Image{Ref: ref, Digest: "sha256:" + ref}, nil
}

func (r *recordingImages) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.pulls)
}

// prepullBackend is a Backend with only a pre-puller (no pool, no root needed).
func prepullBackend(t *testing.T, imgs *recordingImages, maxImages int) *Backend {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	b := &Backend{log: log, prepull: newPrepuller(imgs.Pull, log, maxImages)}
	t.Cleanup(func() {
		if err := b.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return b
}

func waitPulls(t *testing.T, b *Backend, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.prepull.mu.Lock()
		got := b.prepull.pulls
		b.prepull.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pre-pulls finished, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func creds(pw string) *runtime.Credentials {
	return &runtime.Credentials{Username: "sandboxd", Password: pw}
}

// Every target's images (primary, init containers, sidecars; Size 0, any runtime class
// or shape) are pulled once, with the target's credentials, deduplicated by reference;
// a resend of the same set pulls nothing again before the refresh; GC is told the
// digests of the current set only.
func TestPrepullTargets(t *testing.T) {
	imgs := &recordingImages{}
	b := prepullBackend(t, imgs, 8)
	multi := runtime.Spec{
		Container:      runtime.Container{Image: "reg:5000/acme/app:v1", PullCredentials: creds("tok-acme")},
		InitContainers: []runtime.Container{{Name: "init", Image: "busybox:1"}},
		Sidecars:       []runtime.Container{{Name: "db", Image: "reg:5000/acme/db:v2", PullCredentials: creds("tok-acme")}},
		RuntimeClass:   "gvisor",
	}
	plain := runtime.Spec{Container: runtime.Container{Image: "busybox:1"}} // same image as multi's init
	targets := []runtime.WarmTarget{{Key: "acme/multi", Spec: multi}, {Key: "globex/plain", Spec: plain}}
	if err := b.SetWarmPools(context.Background(), targets); err != nil {
		t.Fatal(err)
	}
	waitPulls(t, b, 3)
	want := []string{"reg:5000/acme/app:v1|tok-acme", "busybox:1|", "reg:5000/acme/db:v2|tok-acme"}
	if got := imgs.recorded(); !slices.Equal(got, want) {
		t.Fatalf("pulls %q, want %q", got, want)
	}
	if got := b.PrepulledImages(); !slices.Equal(got, []string{"sha256:reg:5000/acme/app:v1", "sha256:busybox:1", "sha256:reg:5000/acme/db:v2"}) {
		t.Fatalf("PrepulledImages = %q", got)
	}

	// The same set again (fresh credentials), and a set without the template then with
	// it back: nothing is pulled again before the refresh.
	targets[0].Spec.PullCredentials = creds("tok-acme-2")
	for _, ts := range [][]runtime.WarmTarget{targets, targets[1:], targets} {
		if err := b.SetWarmPools(context.Background(), ts); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if got := imgs.recorded(); len(got) != 3 {
		t.Fatalf("re-pulled before the refresh: %q", got)
	}

	// A template gone: its images are no longer spared from GC.
	if err := b.SetWarmPools(context.Background(), targets[1:]); err != nil {
		t.Fatal(err)
	}
	if got := b.PrepulledImages(); !slices.Equal(got, []string{"sha256:busybox:1"}) {
		t.Fatalf("PrepulledImages after the template left = %q", got)
	}
}

// A failing pull is retried after a backoff (SetWarmPools never fails for it); a
// pulled image is pulled again after the refresh, with the latest credentials.
func TestPrepullRetryAndRefresh(t *testing.T) {
	imgs := &recordingImages{fail: map[string]int{"broken:1": 2}}
	b := prepullBackend(t, imgs, 8)
	b.prepull.retryMin, b.prepull.retryMax = 20*time.Millisecond, 40*time.Millisecond
	b.prepull.refresh = time.Hour
	ts := []runtime.WarmTarget{{Key: "a/t", Spec: runtime.Spec{Container: runtime.Container{Image: "broken:1", PullCredentials: creds("p1")}}}}
	if err := b.SetWarmPools(context.Background(), ts); err != nil {
		t.Fatalf("a failing pre-pull is an error of SetWarmPools: %v", err)
	}
	waitPulls(t, b, 3) // two failures, then success
	if got := b.PrepulledImages(); !slices.Equal(got, []string{"sha256:broken:1"}) {
		t.Fatalf("PrepulledImages = %q", got)
	}
	time.Sleep(100 * time.Millisecond)
	if got := imgs.recorded(); len(got) != 3 {
		t.Fatalf("pulls after success %q, want 3", got)
	}

	// Refresh: due again after prepull.refresh, pulled with the credentials last sent.
	b.prepull.mu.Lock()
	b.prepull.refresh = 30 * time.Millisecond
	b.prepull.state["broken:1"].due = time.Now()
	b.prepull.mu.Unlock()
	ts[0].Spec.PullCredentials = creds("p2")
	if err := b.SetWarmPools(context.Background(), ts); err != nil {
		t.Fatal(err)
	}
	waitPulls(t, b, 5)
	got := imgs.recorded()
	if got[3] != "broken:1|p2" || got[4] != "broken:1|p2" {
		t.Fatalf("refresh pulls %q", got)
	}
}

// At most maxImages distinct references, in target order; the rest are counted.
func TestPrepullWantsBounded(t *testing.T) {
	spec := func(imgs ...string) runtime.Spec {
		s := runtime.Spec{Container: runtime.Container{Image: imgs[0]}}
		for _, i := range imgs[1:] {
			s.Sidecars = append(s.Sidecars, runtime.Container{Image: i})
		}
		return s
	}
	targets := []runtime.WarmTarget{
		{Key: "o/1", Spec: spec("a", "b")},
		{Key: "o/2", Spec: spec("pooled")},
		{Key: "o/3", Spec: spec("b", "c", "d")},
		{Key: "o/4", Spec: runtime.Spec{}}, // no image
	}
	want, dropped := prepullWants(targets, map[int]bool{1: true}, 3)
	var refs []string
	for _, w := range want {
		refs = append(refs, w.ref+"@"+w.key)
	}
	if got := strings.Join(refs, ","); got != "a@o/1,b@o/1,c@o/3" || dropped != 1 {
		t.Fatalf("wants %s, dropped %d", got, dropped)
	}
}

// Close stops a pre-puller whose pull is hanging; a set after Close starts nothing.
func TestPrepullClose(t *testing.T) {
	started := make(chan struct{}, 1)
	pull := func(ctx context.Context, ref string, _ *runtime.Credentials) (*Image, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	p := newPrepuller(pull, slog.New(slog.DiscardHandler), 4)
	p.set([]prepullWant{{ref: "x"}}, 0)
	<-started
	p.close()
	p.set([]prepullWant{{ref: "y"}}, 0)
	if p.pulls != 0 {
		t.Fatalf("a cancelled pull counted: %d", p.pulls)
	}
}

// storeImages pulls through a real image store (credentials passed on).
type storeImages struct{ store *image.Store }

func (si storeImages) Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error) {
	var c *image.Credentials
	if creds != nil {
		c = &image.Credentials{Username: creds.Username, Password: creds.Password}
	}
	img, err := si.store.Pull(ctx, ref, c)
	if err != nil {
		return nil, err
	}
	return &Image{Ref: img.Ref, Digest: img.Digest, Layers: img.Layers}, nil
}

// A template without a warm pool (a Size 0 target) has its image in the runner's image
// store, pulled from a registry, without any Create; no container is started for it.
func TestPrepullIntoImageStore(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host, stop, err := testimage.StartRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ref := host + "/acme/plain:1"
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	store, err := image.Open(image.Options{Root: t.TempDir(), Insecure: []string{"127.0.0.1:*"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{OCIRuntime: testOCIRuntime, StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent,
		Images: storeImages{store}, Pool: PoolConfig{Size: 0, MaxTargeted: 4},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	t.Cleanup(func() {
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if _, err := store.Lookup(ref); err == nil {
		t.Fatal("image in the store before the pre-pull")
	}
	spec := runtime.Spec{Container: runtime.Container{Image: ref, Command: "sleep", Args: []string{"inf"}}}
	if err := b.SetWarmPools(ctx, []runtime.WarmTarget{{Key: "acme/plain", Spec: spec, Size: 0}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := store.Lookup(ref)
		if err == nil {
			want, _ := img.Digest()
			if got.Digest != want.String() || len(got.Layers) != 2 {
				t.Fatalf("pre-pulled %+v, want digest %s with 2 layers", got, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("image not pre-pulled: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := b.PoolStats(); st.Refills != 0 || st.Targeted != 0 {
		t.Fatalf("a container was started for a template without a warm pool: %+v", st)
	}
	if d := poolDirs(e.state); len(d) > 0 {
		t.Fatalf("pooled containers: %v", d)
	}
	if got := b.PrepulledImages(); len(got) != 1 {
		t.Fatalf("PrepulledImages = %q", got)
	}
}

// The pre-pull's report per image: PENDING before its pull, PULLING during it, FAILED
// with the (clipped) error and the retry time after a failed pull, PRESENT after the
// retry succeeds (the error cleared); images beyond the bound are counted as left out.
func TestPrepullReport(t *testing.T) {
	started := make(chan string, 4)
	release := make(chan error)
	pull := func(ctx context.Context, ref string, _ *runtime.Credentials) (*Image, error) {
		started <- ref
		select {
		case err := <-release:
			if err != nil {
				return nil, err
			}
			return &Image{Ref: ref, Digest: "sha256:" + ref}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	b := &Backend{log: log, prepull: newPrepuller(pull, log, 2)}
	t.Cleanup(func() {
		if err := b.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	b.prepull.retryMin, b.prepull.retryMax = time.Hour, time.Hour
	targets := []runtime.WarmTarget{
		{Key: "acme/t1", Spec: runtime.Spec{Container: runtime.Container{Image: "reg/a:1"},
			Sidecars: []runtime.Container{{Name: "s", Image: "reg/b:1"}}}},
		{Key: "globex/t2", Spec: runtime.Spec{Container: runtime.Container{Image: "reg/c:1"}}}, // beyond the bound
	}
	if err := b.SetWarmPools(context.Background(), targets); err != nil {
		t.Fatal(err)
	}
	state := func(r runtime.PrepullReport) string {
		var s []string
		for _, i := range r.Images {
			s = append(s, i.Image+"="+string(i.State))
		}
		return fmt.Sprintf("%s left_out=%d", strings.Join(s, ","), r.LeftOut)
	}
	if got := <-started; got != "reg/a:1" {
		t.Fatalf("first pull %s", got)
	}
	r := b.PrepullReport()
	if got := state(r); got != "reg/a:1=PULLING,reg/b:1=PENDING left_out=1" {
		t.Fatalf("report while pulling: %s", got)
	}
	if r.Images[0].Target != "acme/t1" || r.Images[0].Org() != "acme" || r.Images[1].Target != "acme/t1" {
		t.Fatalf("targets: %+v", r.Images)
	}

	before := time.Now()
	release <- fmt.Errorf("%w: manifest unknown %s", runtime.ErrRegistry, strings.Repeat("\xff", 4096))
	if got := <-started; got != "reg/b:1" {
		t.Fatalf("second pull %s", got)
	}
	r = b.PrepullReport()
	if got := state(r); got != "reg/a:1=FAILED,reg/b:1=PULLING left_out=1" {
		t.Fatalf("report after a failed pull: %s", got)
	}
	a := r.Images[0]
	if !strings.Contains(a.LastError, "manifest unknown") || len(a.LastError) > runtime.MaxPrepullErrorLen || !utf8.ValidString(a.LastError) {
		t.Fatalf("last error (%d bytes) %q", len(a.LastError), a.LastError)
	}
	if a.LastAttempt.After(before) || a.NextAttempt.Before(before.Add(59*time.Minute)) {
		t.Fatalf("last attempt %v, next %v (failed at %v, retry after an hour)", a.LastAttempt, a.NextAttempt, before)
	}
	release <- nil
	waitPulls(t, b, 2)
	if got := state(b.PrepullReport()); got != "reg/a:1=FAILED,reg/b:1=PRESENT left_out=1" {
		t.Fatalf("report after the second pull: %s", got)
	}

	// The retry succeeds.
	b.prepull.mu.Lock()
	b.prepull.state["reg/a:1"].due = time.Now()
	b.prepull.mu.Unlock()
	if err := b.SetWarmPools(context.Background(), targets); err != nil {
		t.Fatal(err)
	}
	if got := <-started; got != "reg/a:1" {
		t.Fatalf("retry pulled %s", got)
	}
	release <- nil
	waitPulls(t, b, 3)
	r = b.PrepullReport()
	if got := state(r); got != "reg/a:1=PRESENT,reg/b:1=PRESENT left_out=1" {
		t.Fatalf("report after the retry: %s", got)
	}
	if r.Images[0].LastError != "" {
		t.Fatalf("error kept after a success: %q", r.Images[0].LastError)
	}
}

// The report lists at most runtime.MaxPrepullReportImages images, whatever the bound.
func TestPrepullReportBounded(t *testing.T) {
	imgs := &recordingImages{}
	p := newPrepuller(imgs.Pull, slog.New(slog.DiscardHandler), 1000)
	defer p.close()
	var want []prepullWant
	for i := range runtime.MaxPrepullReportImages + 10 {
		want = append(want, prepullWant{ref: fmt.Sprintf("img/%d", i), key: "o/t"})
	}
	p.set(want, 5)
	r := p.report()
	if len(r.Images) != runtime.MaxPrepullReportImages || r.LeftOut != 15 || r.Images[0].Image != "img/0" {
		t.Fatalf("report of %d images: %d listed (first %q), left out %d", len(want)+5, len(r.Images), r.Images[0].Image, r.LeftOut)
	}
}
