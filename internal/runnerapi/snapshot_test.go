package runnerapi

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRunnerapiSnapshotRPCs: SnapshotVolume, GetSnapshotJob and Delete with snapshots
// carry every field of targets and jobs both ways; a Delete without snapshots is the
// plain Delete; the runner's refusals keep their reason and code.
func TestRunnerapiSnapshotRPCs(t *testing.T) {
	done := time.Unix(1700000000, 0).UTC()
	fake := &fakeRunner{sb: runner.Sandbox{ID: "sb1", State: runner.StateTerminating}, job: runner.SnapshotJob{
		State: runner.SnapshotReady, SizeBytes: 1234, Digest: strings.Repeat("ab", 32), ContentBytes: 99,
		Pause: 7 * time.Millisecond, CompleteTime: done, Reason: "r", Message: "m",
	}}
	r := startRunner(t, fake)
	c := r.client(t)
	ctx := context.Background()
	tgt := runner.SnapshotTarget{Volume: "data", SnapshotID: "fss-1", BlobKey: "fss/o/fss-1.tar.zst", MaxSizeBytes: 1 << 30, Bucket: "acme-fss"}

	job, err := c.SnapshotVolume(ctx, "sb1", tgt)
	want := fake.job
	want.SnapshotID, want.SandboxID, want.Volume = "fss-1", "sb1", "data"
	if err != nil || job != want {
		t.Fatalf("SnapshotVolume = %+v, %v; want %+v", job, err, want)
	}
	if len(fake.targets) != 1 || fake.targets[0] != tgt {
		t.Fatalf("the runner got targets %+v, want %+v", fake.targets, tgt)
	}
	got, err := c.GetSnapshotJob(ctx, "fss-9")
	want.SandboxID, want.Volume, want.SnapshotID = "", "", "fss-9"
	if err != nil || got != want {
		t.Fatalf("GetSnapshotJob = %+v, %v; want %+v", got, err, want)
	}

	fake.targets = nil
	targets := []runner.SnapshotTarget{tgt, {Volume: "cache", SnapshotID: "fss-2", BlobKey: "fss/o/fss-2.tar.zst"}}
	sb, jobs, err := c.DeleteWithSnapshots(ctx, "sb1", 3*time.Second, targets)
	if err != nil || sb.ID != "sb1" || len(jobs) != 2 || jobs[1].SnapshotID != "fss-2" || jobs[1].State != runner.SnapshotCreating {
		t.Fatalf("DeleteWithSnapshots = %+v, %+v, %v", sb, jobs, err)
	}
	if !slices.Equal(fake.targets, targets) || fake.plainDeletes != 0 {
		t.Fatalf("the runner got targets %+v (plain deletes %d)", fake.targets, fake.plainDeletes)
	}
	if _, jobs, err := c.DeleteWithSnapshots(ctx, "sb1", time.Second, nil); err != nil || jobs != nil || fake.plainDeletes != 1 {
		t.Fatalf("a delete without snapshots: jobs %+v, %v, plain deletes %d", jobs, err, fake.plainDeletes)
	}
	if _, err := c.Delete(ctx, "sb1", time.Second); err != nil || fake.plainDeletes != 2 {
		t.Fatalf("Delete: %v, plain deletes %d", err, fake.plainDeletes)
	}

	for _, reason := range []string{apierr.VolumeNotSnapshottable, apierr.FSSInflightLimit, apierr.FSSNotSupported} {
		fake.err = apierr.New(reason, "refused", nil)
		_, err := c.SnapshotVolume(ctx, "sb1", tgt)
		if apierr.Reason(err) != reason || connect.CodeOf(err) != apierr.Code(reason) {
			t.Errorf("%s came back as %v (%s)", reason, err, connect.CodeOf(err))
		}
	}
	fake.err = runner.ErrNotRunning
	if _, err := c.SnapshotVolume(ctx, "sb1", tgt); !errors.Is(err, runner.ErrNotRunning) {
		t.Errorf("not running came back as %v", err)
	}
}

// TestRunnerapiCreateRestores: CreateRequest.Restores travel as each volume's restore
// and come back by volume name; one naming no volume is refused before it is sent.
func TestRunnerapiCreateRestores(t *testing.T) {
	fake := &fakeRunner{sb: runner.Sandbox{ID: "abc"}}
	r := startRunner(t, fake)
	c := r.client(t)
	src := runner.SnapshotSource{SnapshotID: "fss-1", BlobKey: "fss/o/fss-1.tar.zst", Digest: strings.Repeat("cd", 32), SizeBytes: 10, ContentBytes: 20, Bucket: "acme-fss"}
	req := runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: "img"},
		Volumes:   []runtime.Volume{{Name: "data"}, {Name: "scratch"}},
	}, Restores: map[string]runner.SnapshotSource{"data": src}}
	if _, err := c.Create(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if len(fake.got.Restores) != 1 || fake.got.Restores["data"] != src {
		t.Fatalf("the runner got restores %+v", fake.got.Restores)
	}
	req.Restores = map[string]runner.SnapshotSource{"other": src}
	var verr *runner.ValidationError
	if _, err := c.Create(context.Background(), req); !errors.As(err, &verr) {
		t.Fatalf("a restore of no volume: %v", err)
	}
}

// TestCapacitySnapshotsOverTheWire: whether a runner takes snapshots and the digests it
// has cached reach the gateway; an older runner that says nothing takes none.
func TestCapacitySnapshotsOverTheWire(t *testing.T) {
	cached := []string{strings.Repeat("a", 64), strings.Repeat("b", 64)}
	got := capacityFromProto(capacityToProto(runner.Capacity{CachedSnapshots: cached}))
	if got.NoSnapshots || !slices.Equal(got.CachedSnapshots, cached) {
		t.Fatalf("got NoSnapshots %v, cached %v", got.NoSnapshots, got.CachedSnapshots)
	}
	many := make([]string, 300)
	p := capacityToProto(runner.Capacity{})
	p.CachedSnapshots = many
	if n := len(capacityFromProto(p).CachedSnapshots); n != runner.MaxCachedSnapshotsReported {
		t.Fatalf("kept %d cached digests of a runner's 300, want %d", n, runner.MaxCachedSnapshotsReported)
	}
	if !capacityFromProto(nil).NoSnapshots {
		t.Fatal("a runner that says nothing takes snapshots")
	}
}

// TestRunnerapiSnapshotRealRunner: over the wire to a real runner (a Fake backend that
// cannot capture), a snapshot is refused FSS_NOT_SUPPORTED and an unknown job is FAILED.
func TestRunnerapiSnapshotRealRunner(t *testing.T) {
	store, err := dir.Open(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = store.Close() }()
	be := runtimetest.NewFake()
	defer be.Close()
	rn, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Blobs: store})
	if err != nil {
		t.Fatal(err)
	}
	defer rn.Close()
	local := runner.NewLocal("r1", rn)
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServerFor(local, nil).HTTPServer(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer func() { _ = srv.Close() }()
	c := (&testRunner{addr: ln.Addr().String(), ca: ca}).client(t)
	ctx := context.Background()
	_, err = c.SnapshotVolume(ctx, "nope", runner.SnapshotTarget{Volume: "data", SnapshotID: "s1", BlobKey: "fss/o/s1"})
	if apierr.Reason(err) != apierr.FSSNotSupported {
		t.Fatalf("backend without capture: %v", err)
	}
	j, err := c.GetSnapshotJob(ctx, "s1")
	if err != nil || j.State != runner.SnapshotFailed || !strings.Contains(j.Message, "unknown") || !j.Unknown {
		t.Fatalf("unknown job: %+v, %v", j, err)
	}
	capa, err := c.Capacity(ctx)
	if err != nil || !capa.NoSnapshots {
		t.Fatalf("capacity of a runner whose backend cannot snapshot: NoSnapshots %v, %v", capa.NoSnapshots, err)
	}
}
