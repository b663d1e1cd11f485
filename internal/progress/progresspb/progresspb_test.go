package progresspb

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// TestPhasesAgree: every phase of internal/progress has the same number on the wire, and
// a number this build does not know reads as unspecified.
func TestPhasesAgree(t *testing.T) {
	for p := progress.PhaseUnspecified; p <= progress.PhaseWaitingForRunner; p++ {
		w := Phase(p)
		if _, ok := statev1.StartPhase_name[int32(w)]; !ok {
			t.Errorf("phase %d has no wire name", p)
		}
		if PhaseFrom(w) != p {
			t.Errorf("phase %d round-trips to %d", p, PhaseFrom(w))
		}
	}
	if got := PhaseFrom(statev1.StartPhase(99)); got != progress.PhaseUnspecified {
		t.Errorf("unknown phase 99 read as %d, want unspecified", got)
	}
}

// TestPullsRoundTrip: a bounded snapshot survives both conversions unchanged.
func TestPullsRoundTrip(t *testing.T) {
	in := []progress.PullSnapshot{{Image: "busybox", LayersDone: 1, LayersTotal: 2, BytesDone: 10, BytesTotal: 30, Elapsed: 1500 * time.Millisecond,
		Layers: []progress.Layer{{Digest: "0123456789ab", Done: 10, Total: 10, Complete: true}, {Digest: "ba9876543210", Total: 20}}}}
	if got := PullsFrom(Pulls(in)); !reflect.DeepEqual(got, in) {
		t.Errorf("round trip: got %+v, want %+v", got, in)
	}
}

// TestPullsFromBounded: what another process sends is cut to the bounds.
func TestPullsFromBounded(t *testing.T) {
	var pulls []*statev1.ImagePull
	for range progress.MaxPulls + 3 {
		ip := &statev1.ImagePull{Image: strings.Repeat("é", MaxImageRef)}
		for range progress.MaxLayers + 5 {
			ip.Layers = append(ip.Layers, &statev1.LayerProgress{Digest: "sha256:" + strings.Repeat("f", 64)})
		}
		pulls = append(pulls, ip)
	}
	got := PullsFrom(pulls)
	if len(got) != progress.MaxPulls {
		t.Fatalf("%d pulls, want %d", len(got), progress.MaxPulls)
	}
	for _, ps := range got {
		if len(ps.Layers) != progress.MaxLayers || len(ps.Image) > MaxImageRef || len(ps.Layers[0].Digest) != 12 {
			t.Fatalf("unbounded: %d layers, image of %d bytes, digest %q", len(ps.Layers), len(ps.Image), ps.Layers[0].Digest)
		}
		if !utf8.ValidString(ps.Image) {
			t.Fatalf("image clipped inside a character: %q", ps.Image)
		}
	}
}

// TestElapsedFromBounded: a pull's elapsed time from another process is 0 when invalid
// or negative and at most MaxElapsed.
func TestElapsedFromBounded(t *testing.T) {
	for _, c := range []struct {
		in   *durationpb.Duration
		want time.Duration
	}{
		{nil, 0},
		{durationpb.New(-time.Second), 0},
		{&durationpb.Duration{Seconds: 1, Nanos: -5}, 0}, // invalid: signs differ
		{durationpb.New(2 * time.Second), 2 * time.Second},
		{&durationpb.Duration{Seconds: 315_576_000_000}, MaxElapsed},
	} {
		if got := ElapsedFrom(c.in); got != c.want {
			t.Errorf("ElapsedFrom(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
