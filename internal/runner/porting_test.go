package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// portFake is a pauseFake whose checkpoints move through the blob store
// (runtime.CheckpointPorter) on platform platform: an export writes parts "image" and
// "run" (content naming the sandbox); ForkFromCheckpoint reads every part to its end
// (failing every spec when one does not read) and then makes the sandboxes.
type portFake struct {
	*pauseFake
	platform string

	pmu  sync.Mutex
	read map[string]string // part → content read by the last ForkFromCheckpoint
	// onImport, when set, runs first in ForkFromCheckpoint (a test stops it there).
	onImport func(specs []*runtime.Spec)
	// egress is what ExportCheckpoint reports as the sandbox's egress state;
	// gotEgress what the last ForkFromCheckpoint was given.
	egress, gotEgress *runtime.EgressState
}

var _ runtime.CheckpointPorter = (*portFake)(nil)

func newPortFake(platform string) *portFake {
	return &portFake{pauseFake: newPauseFake(checkpointing), platform: platform}
}

func (f *portFake) CheckpointPlatform(string) string { return f.platform }

func (f *portFake) ExportCheckpoint(ctx context.Context, id string, put func(context.Context, string, io.Reader) error) (runtime.CheckpointExport, error) {
	if sb := f.Sandbox(id, 0); sb == nil {
		return runtime.CheckpointExport{}, runtime.ErrNotFound
	}
	f.pmu.Lock()
	cp := runtime.CheckpointExport{Platform: f.platform, Class: "fake", Egress: f.egress}
	f.pmu.Unlock()
	for _, part := range []string{"image", "run"} {
		content := part + " of " + id
		if err := put(ctx, part, strings.NewReader(content)); err != nil {
			return runtime.CheckpointExport{}, err
		}
		cp.Parts = append(cp.Parts, part)
		cp.Bytes += int64(len(content))
	}
	return cp, nil
}

func (f *portFake) ForkFromCheckpoint(ctx context.Context, cp runtime.CheckpointExport, open func(context.Context, string) (io.ReadCloser, error), specs []*runtime.Spec) ([]runtime.Info, []error) {
	fail := func(err error) ([]runtime.Info, []error) {
		errs := make([]error, len(specs))
		for i := range errs {
			errs[i] = err
		}
		return nil, errs
	}
	if f.onImport != nil {
		f.onImport(specs)
	}
	if cp.Platform != f.platform {
		return fail(fmt.Errorf("platform %q, not %q", cp.Platform, f.platform))
	}
	read := map[string]string{}
	for _, p := range cp.Parts {
		rc, err := open(ctx, p)
		if err != nil {
			return fail(err)
		}
		b, err := io.ReadAll(rc)
		_ = rc.Close()
		if err != nil {
			return fail(err)
		}
		read[p] = string(b)
	}
	f.pmu.Lock()
	f.read, f.gotEgress = read, cp.Egress
	f.pmu.Unlock()
	return f.Fork(ctx, "", specs)
}

func (f *portFake) lastRead() map[string]string {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	return f.read
}

// portLocal is a Local (2 CPUs, 8 GiB) over be on dataDir ("" = a new one) with blob
// store blobs.
func portLocal(t *testing.T, id string, be runtime.Backend, dataDir string, blobs blob.Store) *Local {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	r, err := New(context.Background(), Config{Backend: be, DataDir: dataDir, Blobs: blobs, ExpiryGrace: 10 * time.Millisecond, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	l := NewLocal(id, r)
	l.MilliCPU, l.MemoryBytes = 2000, 8<<30
	return l
}

func blobStore(t *testing.T) blob.Store {
	t.Helper()
	s, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func keysUnder(t *testing.T, s blob.Store, prefix string) []string {
	t.Helper()
	var out []string
	for info, err := range s.List(context.Background(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, info.Key)
	}
	return out
}

func prefixOf(key string) string { return strings.TrimSuffix(key, manifestName) }

func TestExportCheckpointWritesPartsThenManifest(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	a := portLocal(t, "r1", newPortFake("p1"), "", store)
	sb := runningSandbox(t, a, nil, time.Hour)

	ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if src.ID != sb.ID || src.State != StateRunning || ref.Platform != "p1" {
		t.Fatalf("export: ref %+v, source %s %s", ref, src.ID, src.State)
	}
	if !strings.HasPrefix(ref.Key, "checkpoints/"+sb.ID+"/") || !strings.HasSuffix(ref.Key, "/manifest.json") {
		t.Fatalf("key %q", ref.Key)
	}
	keys := keysUnder(t, store, prefixOf(ref.Key))
	want := []string{prefixOf(ref.Key) + "image", ref.Key, prefixOf(ref.Key) + "run"}
	if !slices.Equal(keys, want) {
		t.Fatalf("objects %v, want %v", keys, want)
	}
	rc, err := store.Get(ctx, ref.Key)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	_ = rc.Close()
	var m checkpointManifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, p := range m.Parts {
		sum += p.Size
	}
	if m.Version != 1 || m.Platform != "p1" || m.SandboxID != sb.ID || len(m.Parts) != 2 || m.Parts[0].Name != "image" ||
		len(m.Parts[0].SHA256) != 64 || sum != ref.Bytes || ref.Bytes != int64(len("image of "+sb.ID)+len("run of "+sb.ID)) ||
		m.Spec.Image != "busybox" || m.Created.IsZero() {
		t.Fatalf("manifest %s (ref bytes %d)", b, ref.Bytes)
	}

	// Without a blob store: refused, saying so.
	noStore := portLocal(t, "r3", newPortFake("p1"), "", nil)
	sb2 := runningSandbox(t, noStore, nil, time.Hour)
	if _, _, err := noStore.ExportCheckpoint(ctx, sb2.ID); !errors.Is(err, ErrCannotCheckpoint) || !strings.Contains(err.Error(), "no blob store") {
		t.Fatalf("export without a blob store: %v", err)
	}
	if c, _ := noStore.Capacity(ctx); len(c.CheckpointPlatforms) != 0 {
		t.Fatalf("platforms without a blob store: %v", c.CheckpointPlatforms)
	}
	if c, _ := a.Capacity(ctx); c.CheckpointPlatforms[c.RuntimeClasses[0]] != "p1" {
		t.Fatalf("platforms: %v (classes %v)", c.CheckpointPlatforms, c.CheckpointClasses)
	}
	if _, _, err := a.ExportCheckpoint(ctx, "nosuch"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("export of an unknown sandbox: %v", err)
	}
}

func TestImportForkOnAnotherRunner(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	a := portLocal(t, "r1", newPortFake("p1"), "", store)
	beB := newPortFake("p1")
	b := portLocal(t, "r2", beB, "", store)
	sb := runningSandbox(t, a, map[string]string{runtime.MetaOrg: "org1"}, time.Hour)
	ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Targets: []ForkTarget{
		{ID: "fork-1", Meta: map[string]string{runtime.MetaOrg: "org1"}, Lifetime: time.Minute},
		{ID: "fork-2", Meta: map[string]string{runtime.MetaOrg: "org1"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("fork %d: %v", i, r.Err)
		}
		got := awaitState(t, b.R, r.Sandbox.ID, StateRunning)
		if got.Spec.Meta[runtime.MetaForkedFrom] != sb.ID || got.Spec.Image != "busybox@sha256:fake" || got.Spec.Meta[runtime.MetaOrg] != "org1" {
			t.Fatalf("fork %d: %+v", i, got)
		}
	}
	if got, _ := b.R.Get("fork-1"); got.Lifetime != time.Minute {
		t.Fatalf("fork-1 lifetime %s", got.Lifetime)
	}
	if got, _ := b.R.Get("fork-2"); got.Lifetime != time.Hour {
		t.Fatalf("fork-2 lifetime %s (the source's expected)", got.Lifetime)
	}
	if r := beB.lastRead(); r["image"] != "image of "+sb.ID || r["run"] != "run of "+sb.ID {
		t.Fatalf("parts read: %v", r)
	}
	if _, err := a.R.Get(sb.ID); err != nil {
		t.Fatalf("the source after a fork elsewhere: %v", err)
	}

	// A platform of its own: refused, naming both.
	c := portLocal(t, "r3", newPortFake("p2"), "", store)
	_, err = c.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Targets: []ForkTarget{{ID: "fork-3"}}})
	if !errors.Is(err, ErrCannotCheckpoint) || !strings.Contains(err.Error(), `"p1"`) || !strings.Contains(err.Error(), `"p2"`) {
		t.Fatalf("platform mismatch: %v", err)
	}
	if ae := APIError("fork-3", err, ""); apierr.Reason(ae) != apierr.CheckpointNotSupported {
		t.Fatalf("platform mismatch as the API says it: %v", ae)
	}
	// The caller's platform is checked too.
	bad := ref
	bad.Platform = "p9"
	if _, err := b.ImportFork(ctx, ImportRequest{Ref: bad, Source: src, Targets: []ForkTarget{{ID: "fork-4"}}}); !errors.Is(err, ErrCannotCheckpoint) {
		t.Fatalf("caller's platform: %v", err)
	}
	// Another sandbox's description: refused.
	other := src
	other.Spec = cloneSpec(src.Spec)
	other.Spec.Image = "alpine"
	var verr *ValidationError
	if _, err := b.ImportFork(ctx, ImportRequest{Ref: ref, Source: other, Targets: []ForkTarget{{ID: "fork-5"}}}); !errors.As(err, &verr) {
		t.Fatalf("spec mismatch: %v", err)
	}
	// No such checkpoint.
	missing := ref
	missing.Key = "checkpoints/" + sb.ID + "/nosuch/manifest.json"
	if _, err := b.ImportFork(ctx, ImportRequest{Ref: missing, Source: src, Targets: []ForkTarget{{ID: "fork-6"}}}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("missing checkpoint: %v", err)
	}
	// Not a manifest key.
	for _, k := range []string{"checkpoints/../x/manifest.json", "snapshots/a/b/manifest.json", "checkpoints/a/b/image"} {
		bad := ref
		bad.Key = k
		if _, err := b.ImportFork(ctx, ImportRequest{Ref: bad, Source: src, Targets: []ForkTarget{{ID: "fork-7"}}}); !errors.As(err, &verr) {
			t.Fatalf("key %q: %v", k, err)
		}
		if err := b.DeleteCheckpoint(ctx, k); !errors.As(err, &verr) {
			t.Fatalf("delete key %q: %v", k, err)
		}
	}
	// No room for all targets.
	b.MilliCPU, b.MaxSandboxes = 2000, 3
	_, err = b.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Targets: []ForkTarget{{ID: "fork-8"}, {ID: "fork-9"}}})
	if apierr.Reason(err) != apierr.RunnerCapacityExhausted {
		t.Fatalf("no room: %v", err)
	}
	for _, id := range []string{"fork-3", "fork-4", "fork-5", "fork-8", "fork-9"} {
		if _, err := b.R.Get(id); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("%s after a refused import: %v", id, err)
		}
	}
}

func TestImportForkRefusesTamperedCheckpoints(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	a := portLocal(t, "r1", newPortFake("p1"), "", store)
	b := portLocal(t, "r2", newPortFake("p1"), "", store)
	sb := runningSandbox(t, a, nil, time.Hour)

	manifestOf := func(ref CheckpointRef) map[string]any {
		rc, err := store.Get(ctx, ref.Key)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		var m map[string]any
		if err := json.NewDecoder(rc).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	putManifest := func(ref CheckpointRef, m map[string]any) {
		bs, _ := json.Marshal(m)
		if _, err := store.Put(ctx, ref.Key, bytes.NewReader(bs), int64(len(bs))); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	importOne := func(ref CheckpointRef, src Sandbox) (ForkResult, error) {
		n++
		res, err := b.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Targets: []ForkTarget{{ID: fmt.Sprintf("t-%d", n)}}})
		if err != nil {
			return ForkResult{}, err
		}
		return res[0], nil
	}

	// A part replaced in the store: its sha256 is not the manifest's.
	ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, prefixOf(ref.Key)+"run", strings.NewReader("evil run of "+sb.ID), -1); err != nil {
		t.Fatal(err)
	}
	res, err := importOne(ref, src)
	if err != nil || res.Err == nil || !strings.Contains(res.Err.Error(), "sha256") {
		t.Fatalf("tampered part: %v / %+v", err, res)
	}
	if got := awaitState(t, b.R, res.Sandbox.ID, StateFailed); got.Reason != ReasonForkFailed {
		t.Fatalf("failed fork: %s %s", got.State, got.Reason)
	}

	// A manifest saying another sha256 (or size) than the part has.
	ref, src, err = a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	m := manifestOf(ref)
	m["parts"].([]any)[0].(map[string]any)["sha256"] = strings.Repeat("0", 64)
	putManifest(ref, m)
	if res, err := importOne(ref, src); err != nil || res.Err == nil || !strings.Contains(res.Err.Error(), "sha256") {
		t.Fatalf("manifest with another sha256: %v / %+v", err, res)
	}

	// Fields this runner does not know, bad versions, names, sizes: refused whole.
	for name, change := range map[string]func(m map[string]any){
		"unknown field":   func(m map[string]any) { m["run_this"] = "/bin/sh" },
		"unknown in spec": func(m map[string]any) { m["spec"].(map[string]any)["privileged"] = true },
		"version":         func(m map[string]any) { m["version"] = 2 },
		"part name":       func(m map[string]any) { m["parts"].([]any)[0].(map[string]any)["name"] = "../../etc" },
		"negative size":   func(m map[string]any) { m["parts"].([]any)[0].(map[string]any)["size"] = -1 },
		"no parts":        func(m map[string]any) { m["parts"] = []any{} },
		"other sandbox":   func(m map[string]any) { m["sandbox_id"] = "someone-else" },
		"platform":        func(m map[string]any) { m["platform"] = "p2" },
	} {
		ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		m := manifestOf(ref)
		change(m)
		putManifest(ref, m)
		if _, err := importOne(ref, src); err == nil || !errors.Is(err, ErrCannotCheckpoint) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// A spec of its own in the manifest (what the backend would be given): refused.
	for name, change := range map[string]func(m map[string]any){
		"env": func(m map[string]any) { m["spec"].(map[string]any)["env"] = map[string]any{"LD_PRELOAD": "/evil.so"} },
		"network": func(m map[string]any) {
			m["spec"].(map[string]any)["network"] = map[string]any{"egress": []any{map[string]any{"any": true}}}
		},
		"meta": func(m map[string]any) {
			m["spec"].(map[string]any)["meta"] = map[string]any{runtime.MetaOrg: "another-org"}
		},
	} {
		ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		m := manifestOf(ref)
		change(m)
		putManifest(ref, m)
		var verr *ValidationError
		if _, err := importOne(ref, src); !errors.As(err, &verr) || !strings.Contains(err.Error(), "not of this sandbox") {
			t.Fatalf("manifest with another %s: %v", name, err)
		}
	}
	// Too big a manifest.
	ref, src, err = a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	huge := bytes.Repeat([]byte(" "), maxManifestBytes+10)
	if _, err := store.Put(ctx, ref.Key, bytes.NewReader(huge), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := importOne(ref, src); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("huge manifest: %v", err)
	}
}

func TestMoveKeepsWhatTheSourceHad(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	beA := newPortFake("p1")
	dirA := t.TempDir()
	a := portLocal(t, "r1", beA, dirA, store)
	beB, dirB := newPortFake("p1"), t.TempDir()
	b := portLocal(t, "r2", beB, dirB, store)
	held := runningSandbox(t, a, map[string]string{runtime.MetaPauseLifetime: "held", "k": "v"}, time.Hour)
	counted := runningSandbox(t, a, nil, time.Hour)
	release := true
	for _, id := range []string{held.ID, counted.ID} {
		if _, err := a.Pause(ctx, id, PauseOptions{Release: &release}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // time paused, which a held lifetime does not count

	move := func(id string) (Sandbox, Sandbox) {
		ref, src, err := a.ExportCheckpoint(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if src.State != StatePaused {
			t.Fatalf("source after the export: %s", src.State)
		}
		res, err := b.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Move: true, Targets: []ForkTarget{{ID: id, Meta: map[string]string{"ignored": "x"}}}})
		if err != nil || res[0].Err != nil {
			t.Fatalf("move %s: %v %v", id, err, res[0].Err)
		}
		return src, awaitState(t, b.R, id, StateRunning)
	}
	src, got := move(held.ID)
	if !got.CreatedAt.Equal(src.CreatedAt) || got.Lifetime < src.Lifetime+50*time.Millisecond || !got.Deadline.Equal(got.CreatedAt.Add(got.Lifetime)) {
		t.Fatalf("held lifetime: source created %s lifetime %s; moved created %s lifetime %s deadline %s",
			src.CreatedAt, src.Lifetime, got.CreatedAt, got.Lifetime, got.Deadline)
	}
	if got.Spec.Meta["k"] != "v" || got.Spec.Meta["ignored"] != "" || got.Spec.Meta[runtime.MetaForkedFrom] != "" {
		t.Fatalf("moved meta: %v", got.Spec.Meta)
	}
	movedHeld := got
	src, got = move(counted.ID)
	if !got.CreatedAt.Equal(src.CreatedAt) || got.Lifetime != src.Lifetime || !got.Deadline.Equal(src.Deadline) {
		t.Fatalf("counted lifetime: source %s %s %s, moved %s %s %s", src.CreatedAt, src.Lifetime, src.Deadline, got.CreatedAt, got.Lifetime, got.Deadline)
	}
	// A move where the sandbox is: refused (it exists).
	if _, err := b.ImportFork(ctx, ImportRequest{Ref: CheckpointRef{Key: "checkpoints/" + held.ID + "/x/manifest.json", Platform: "p1"}, Source: src, Move: true,
		Targets: []ForkTarget{{ID: held.ID}}}); err == nil {
		t.Fatal("a move onto a runner that has the sandbox: accepted")
	}

	// The source runner lets go of it: ended (Moved) and forgotten, also across a restart.
	if err := a.Moved(ctx, counted.ID, "r2"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.R.Get(counted.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("after Moved: %v", err)
	}
	if slices.ContainsFunc(a.R.List(), func(s Sandbox) bool { return s.ID == counted.ID }) {
		t.Fatal("after Moved: listed")
	}
	if _, _, resumes := beA.counts(); resumes != 0 {
		t.Fatalf("Moved resumed it (%d resumes)", resumes)
	}
	if err := a.Moved(ctx, held.ID, ""); err != nil {
		t.Fatal(err)
	}
	running := runningSandbox(t, a, nil, time.Hour)
	if err := a.Moved(ctx, running.ID, "r2"); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Moved of a running sandbox: %v", err)
	}
	a.R.Close()
	a2 := portLocal(t, "r1", beA, dirA, store)
	for _, id := range []string{held.ID, counted.ID} {
		if _, err := a2.R.Get(id); !errors.Is(err, runtime.ErrNotFound) {
			t.Fatalf("%s after a restart: %v", id, err)
		}
	}
	if _, err := a2.R.Get(running.ID); err != nil {
		t.Fatalf("the other sandbox after a restart: %v", err)
	}

	// The runner it moved to keeps what it had across its own restart.
	b.R.Close()
	b2 := portLocal(t, "r2", beB, dirB, store)
	again, err := b2.R.Get(held.ID)
	if err != nil || again.State != StateRunning || !again.CreatedAt.Equal(movedHeld.CreatedAt) || again.Lifetime != movedHeld.Lifetime {
		t.Fatalf("moved sandbox after its runner's restart: %v %s created %s lifetime %s, want created %s lifetime %s",
			err, again.State, again.CreatedAt, again.Lifetime, movedHeld.CreatedAt, movedHeld.Lifetime)
	}
}

// A runner that crashed after Moved began (the backend still has the paused sandbox, the
// move is on disk) destroys it rather than re-adopt it.
func TestMovedSurvivesACrash(t *testing.T) {
	ctx := context.Background()
	be := newPortFake("p1")
	dataDir := t.TempDir()
	a := portLocal(t, "r1", be, dataDir, blobStore(t))
	sb := runningSandbox(t, a, nil, time.Hour)
	release := true
	if _, err := a.Pause(ctx, sb.ID, PauseOptions{Release: &release}); err != nil {
		t.Fatal(err)
	}
	a.R.Close()
	if err := os.WriteFile(filepath.Join(dataDir, movedDir, sb.ID), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a2 := portLocal(t, "r1", be, dataDir, nil)
	if _, err := a2.R.Get(sb.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("after the restart: %v", err)
	}
	eventually(t, "the moved sandbox destroyed", func() bool { return be.Sandbox(sb.ID, 0) == nil })
	eventually(t, "the move's mark removed", func() bool {
		_, err := os.Stat(filepath.Join(dataDir, movedDir, sb.ID))
		return errors.Is(err, os.ErrNotExist)
	})
}

func TestDeleteCheckpointRemovesEveryObject(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	a := portLocal(t, "r1", newPortFake("p1"), "", store)
	sb := runningSandbox(t, a, nil, time.Hour)
	ref, _, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	keep, _, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteCheckpoint(ctx, ref.Key); err != nil {
		t.Fatal(err)
	}
	if keys := keysUnder(t, store, prefixOf(ref.Key)); len(keys) != 0 {
		t.Fatalf("left after the delete: %v", keys)
	}
	if keys := keysUnder(t, store, prefixOf(keep.Key)); len(keys) != 3 {
		t.Fatalf("another export's objects: %v", keys)
	}
	if err := a.DeleteCheckpoint(ctx, ref.Key); err != nil {
		t.Fatalf("deleted again: %v", err)
	}
}

// An import the runner's crash interrupted (its entries made, the backend's work under
// way) leaves no sandbox CREATING for ever: the restarted runner knows none it did not
// persist (the gateway reports such a sandbox FAILED, reason Lost), and one the backend
// had begun to make but that does not run ends FAILED (Vanished).
func TestImportInterruptedByACrash(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	a := portLocal(t, "r1", newPortFake("p1"), "", store)
	sb := runningSandbox(t, a, nil, time.Hour)
	ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	beB, dirB := newPortFake("p1"), t.TempDir()
	beB.onImport = func(specs []*runtime.Spec) {
		beB.Put(runtime.Recovered{Spec: *specs[1], Alive: false}) // begun, not running
		<-make(chan struct{})                                     // the crash: it never goes on
	}
	b := portLocal(t, "r2", beB, dirB, store)
	go func() {
		_, _ = b.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Targets: []ForkTarget{{ID: "t-none"}, {ID: "t-begun"}}})
	}()
	awaitState(t, b.R, "t-none", StateCreating)
	b.R.Close()

	b2 := portLocal(t, "r2", beB, dirB, store)
	if _, err := b2.R.Get("t-none"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("an import target the backend never made: %v", err)
	}
	if got := awaitState(t, b2.R, "t-begun", StateFailed); got.Reason == "" {
		t.Fatalf("an import target the backend had begun: %s without a reason", got.State)
	}
}

// A move whose lifetime ran out meanwhile ends as an expiry does.
func TestMovePastItsLifetimeEnds(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	a := portLocal(t, "r1", newPortFake("p1"), "", store)
	b := portLocal(t, "r2", newPortFake("p1"), "", store)
	sb := runningSandbox(t, a, nil, time.Hour)
	ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	src.CreatedAt, src.Lifetime = time.Now().Add(-2*time.Hour), time.Hour
	src.Deadline = src.CreatedAt.Add(src.Lifetime)
	res, err := b.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Move: true, Targets: []ForkTarget{{ID: sb.ID}}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("move: %v %+v", err, res)
	}
	if got := awaitState(t, b.R, sb.ID, StateCompleted); got.Reason != ReasonLifetimeExceeded {
		t.Fatalf("moved past its lifetime: %s %s", got.State, got.Reason)
	}
}

// TestExportHoldsAutoResume: an export of a checkpointed sandbox holds it paused — an
// auto-resume (here: Resume, which Agent and Wake call) waits — until the export is
// deleted (then it resumes here) or the sandbox moved (then it is no longer here).
func TestExportHoldsAutoResume(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	a := portLocal(t, "r1", newPortFake("p1"), t.TempDir(), store)
	release := true
	resumeAsync := func(id string) chan error {
		done := make(chan error, 1)
		go func() { _, err := a.R.Resume(ctx, id); done <- err }()
		return done
	}
	blocked := func(done chan error) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("resume during a held export returned: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}

	// Given up (DeleteCheckpoint): the waiting resume resumes it here.
	sb := runningSandbox(t, a, nil, time.Hour)
	if _, err := a.Pause(ctx, sb.ID, PauseOptions{Release: &release, AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	ref, _, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	done := resumeAsync(sb.ID)
	blocked(done)
	if got, _ := a.R.Get(sb.ID); got.State != StatePaused {
		t.Fatalf("during the hold: %s", got.State)
	}
	if err := a.DeleteCheckpoint(ctx, ref.Key); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("resume after the export was deleted: %v", err)
	}
	if got, _ := a.R.Get(sb.ID); got.State != StateRunning {
		t.Fatalf("after the hold: %s", got.State)
	}

	// Moved: the waiting resume finds it gone, never running here.
	sb2 := runningSandbox(t, a, nil, time.Hour)
	if _, err := a.Pause(ctx, sb2.ID, PauseOptions{Release: &release, AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.ExportCheckpoint(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	done = resumeAsync(sb2.ID)
	blocked(done)
	if err := a.Moved(ctx, sb2.ID, "r2"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrNotRunning) && !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("resume of a sandbox that moved away: %v", err)
	}

	// A running source's export (a fork) holds nothing.
	sb3 := runningSandbox(t, a, nil, time.Hour)
	if _, _, err := a.ExportCheckpoint(ctx, sb3.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pause(ctx, sb3.ID, PauseOptions{Release: &release, AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-resumeAsync(sb3.ID):
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("resume of a sandbox whose running state was exported: held")
	}
}

// An export an earlier process did not finish (killed before the manifest) leaves parts
// nothing reads: the restarted runner removes them for its sandboxes, and leaves
// complete exports, other sandboxes' objects and its own exports alone.
func TestUnfinishedExportsSwept(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	be, dataDir := newPortFake("p1"), t.TempDir()
	a := portLocal(t, "r1", be, dataDir, store)
	sb := runningSandbox(t, a, nil, time.Hour)
	complete, _, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) {
		t.Helper()
		if _, err := store.Put(ctx, key, strings.NewReader("part"), 4); err != nil {
			t.Fatal(err)
		}
	}
	cut := checkpointsPrefix + sb.ID + "/" + NewID() + "/"
	put(cut + "image")
	put(cut + "run")
	other := checkpointsPrefix + "someone-else/" + NewID() + "/image"
	put(other)
	a.R.Close()

	a2 := portLocal(t, "r1", be, dataDir, store)
	eventually(t, "the unfinished export removed", func() bool { return len(keysUnder(t, store, cut)) == 0 })
	if keys := keysUnder(t, store, prefixOf(complete.Key)); len(keys) != 3 {
		t.Errorf("a complete export after the sweep: %v", keys)
	}
	if keys := keysUnder(t, store, other); len(keys) != 1 {
		t.Errorf("another sandbox's object after the sweep: %v", keys)
	}
	if _, _, err := a2.ExportCheckpoint(ctx, sb.ID); err != nil {
		t.Fatalf("export after the sweep: %v", err)
	}
}

// TestStaleExportsSwept: a complete export older than ExportMaxAge (a gateway died
// between the export and its delete) is removed by the runner's periodic sweep, and its
// hold lapses with it; a younger one stays.
func TestStaleExportsSwept(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	r, err := New(context.Background(), Config{Backend: newPortFake("p1"), DataDir: t.TempDir(), Blobs: store, ExpiryGrace: 10 * time.Millisecond,
		Logger: testLogger(), ExportMaxAge: time.Second, ExportSweep: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	a := NewLocal("r1", r)
	a.MilliCPU, a.MemoryBytes = 2000, 8<<30
	sb := runningSandbox(t, a, nil, time.Hour)
	release := true
	if _, err := a.Pause(ctx, sb.ID, PauseOptions{Release: &release, AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	old, _, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(keysUnder(t, store, prefixOf(old.Key))); n == 0 {
		t.Fatal("export wrote nothing")
	}
	eventually(t, "the stale export removed", func() bool { return len(keysUnder(t, store, prefixOf(old.Key))) == 0 })
	// Its hold went with it: a resume does not wait for it.
	done := make(chan error, 1)
	go func() { _, err := a.R.Resume(ctx, sb.ID); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("resume held by a swept export")
	}
	fresh, _, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(keysUnder(t, store, prefixOf(fresh.Key))); n == 0 {
		t.Fatal("a fresh export swept at once")
	}
}

// TestSpecDiffIgnoresDiskLimits: a group's spec as a restarted runner reports it (the
// disk limit its backend recorded, on every container) is the same sandbox as the
// gateway's copy (no wire field carries a disk limit); any other difference, a
// sidecar's included, is named.
func TestSpecDiffIgnoresDiskLimits(t *testing.T) {
	res := runtime.Resources{MilliCPU: 500, MemoryBytes: 128 << 20}
	a := runtime.Spec{ID: "g", Container: runtime.Container{Name: "main", Image: "img", Resources: res},
		Sidecars: []runtime.Container{{Name: "side", Image: "img", Resources: res}}}
	b := cloneSpec(a)
	for _, c := range b.AllContainers() {
		c.Resources.DiskBytes = 5 << 30
	}
	if d := specDiff(a, b); len(d) != 0 {
		t.Errorf("specs differing in disk limits only: %v", d)
	}
	b.Sidecars[0].Resources.MemoryBytes = 256 << 20
	if d := specDiff(a, b); !slices.Equal(d, []string{"sidecars"}) {
		t.Errorf("a sidecar's memory differs: %v, want [sidecars]", d)
	}
	if a.Sidecars[0].Resources.DiskBytes != 0 || b.Resources.DiskBytes != 5<<30 {
		t.Error("specDiff changed its arguments")
	}
}
