package runnerapi

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/progress/progresspb"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// progressRunner is a fakeRunner whose WatchProgress sends updates, or fails with err.
type progressRunner struct {
	*fakeRunner
	updates []runner.StartProgress
	err     error
}

func (p *progressRunner) WatchProgress(_ context.Context, id string, send func(runner.StartProgress) error) error {
	if p.err != nil {
		return p.err
	}
	for _, u := range p.updates {
		if err := send(u); err != nil {
			return err
		}
	}
	return nil
}

// TestRunnerapiWatchProgress: a runner's start progress crosses the runner API (mTLS,
// gRPC) unchanged, in order; an unknown sandbox is runtime.ErrNotFound on the gateway's
// side.
func TestRunnerapiWatchProgress(t *testing.T) {
	since := time.Unix(1700000000, 0).UTC()
	pull := progress.PullSnapshot{Image: "127.0.0.1:5000/busybox:latest", LayersDone: 1, LayersTotal: 2, BytesDone: 300, BytesTotal: 1000,
		Layers: []progress.Layer{{Digest: "0123456789ab", Done: 100, Total: 100, Complete: true}, {Digest: "ba9876543210", Done: 200, Total: 900}}}
	want := []runner.StartProgress{
		{State: runner.StateCreating, Snapshot: progress.Snapshot{Phase: progress.PhasePullingImage, Since: since, Pulls: []progress.PullSnapshot{pull}}},
		{State: runner.StateRunning, Snapshot: progress.Snapshot{Phase: progress.PhaseRunning, Since: since.Add(time.Second)}},
	}
	pr := &progressRunner{fakeRunner: &fakeRunner{}, updates: want}
	tr := startRunnerBackend(t, pr)
	c := tr.client(t)
	var got []runner.StartProgress
	if err := c.WatchProgress(context.Background(), "sb-1", func(p runner.StartProgress) error { got = append(got, p); return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	pr.updates, pr.err = nil, runtime.ErrNotFound
	if err := c.WatchProgress(context.Background(), "sb-2", func(runner.StartProgress) error { return nil }); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("unknown sandbox: %v, want not found", err)
	}
}

// TestProgressFromProtoBounded: what a runner sends is bounded on the gateway's side as
// a runner's own progress is (pulls, layers, digests, image names).
func TestProgressFromProtoBounded(t *testing.T) {
	p := runner.StartProgress{State: runner.StateCreating}
	for range progress.MaxPulls + 3 {
		ps := progress.PullSnapshot{Image: strings.Repeat("x", 5000)}
		for range progress.MaxLayers + 3 {
			ps.Layers = append(ps.Layers, progress.Layer{Digest: "sha256:" + strings.Repeat("f", 64)})
		}
		p.Pulls = append(p.Pulls, ps)
	}
	got := ProgressFromProto(ProgressToProto(p))
	if len(got.Pulls) != progress.MaxPulls {
		t.Fatalf("%d pulls", len(got.Pulls))
	}
	for _, ps := range got.Pulls {
		if len(ps.Layers) != progress.MaxLayers || len(ps.Image) > progresspb.MaxImageRef || len(ps.Layers[0].Digest) != 12 {
			t.Fatalf("unbounded pull: %d layers, image of %d bytes, digest %q", len(ps.Layers), len(ps.Image), ps.Layers[0].Digest)
		}
	}
}
