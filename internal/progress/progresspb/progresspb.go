// Package progresspb converts start progress (internal/progress) to and from the one
// protobuf description both hops use: the runner API (sandboxd.runner.v1.WatchProgress)
// and the public API (sandboxd.sandbox.v1.WatchSandboxProgress) carry the same
// sandboxd.sandbox.v1 StartPhase and ImagePull messages.
package progresspb

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// MaxImageRef bounds an image reference taken from a message.
const MaxImageRef = 512

// Phase converts a phase.
func Phase(p progress.Phase) statev1.StartPhase { return statev1.StartPhase(p) }

// PhaseFrom converts a message's phase; a value this build does not know is unspecified.
func PhaseFrom(p statev1.StartPhase) progress.Phase {
	if _, known := statev1.StartPhase_name[int32(p)]; !known {
		return progress.Phase(statev1.StartPhase_START_PHASE_UNSPECIFIED)
	}
	return progress.Phase(p)
}

// Pulls converts pulls (already bounded by progress.Pull.Snapshot).
func Pulls(pulls []progress.PullSnapshot) []*statev1.ImagePull {
	var out []*statev1.ImagePull
	for _, pl := range pulls {
		ip := &statev1.ImagePull{Image: pl.Image, LayersDone: int32(pl.LayersDone), LayersTotal: int32(pl.LayersTotal),
			BytesDone: pl.BytesDone, BytesTotal: pl.BytesTotal, Elapsed: durationpb.New(pl.Elapsed)}
		for _, l := range pl.Layers {
			ip.Layers = append(ip.Layers, &statev1.LayerProgress{Digest: l.Digest, BytesDone: l.Done, BytesTotal: l.Total, Complete: l.Complete})
		}
		out = append(out, ip)
	}
	return out
}

// PullsFrom converts pulls from a message another process sent, bounded as a runner's
// own would be: at most progress.MaxPulls pulls of progress.MaxLayers layers, short
// digests, image references clipped to MaxImageRef bytes of valid UTF-8.
func PullsFrom(pulls []*statev1.ImagePull) []progress.PullSnapshot {
	var out []progress.PullSnapshot
	for i, ip := range pulls {
		if i == progress.MaxPulls {
			break
		}
		ps := progress.PullSnapshot{Image: textclip.Clip(ip.GetImage(), MaxImageRef), LayersDone: int(ip.GetLayersDone()), LayersTotal: int(ip.GetLayersTotal()),
			BytesDone: ip.GetBytesDone(), BytesTotal: ip.GetBytesTotal(), Elapsed: ElapsedFrom(ip.GetElapsed())}
		for j, l := range ip.GetLayers() {
			if j == progress.MaxLayers {
				break
			}
			ps.Layers = append(ps.Layers, progress.Layer{Digest: progress.ShortDigest(l.GetDigest()), Done: l.GetBytesDone(), Total: l.GetBytesTotal(), Complete: l.GetComplete()})
		}
		out = append(out, ps)
	}
	return out
}

// MaxElapsed bounds a pull's elapsed time taken from a message: no start waits longer.
const MaxElapsed = 24 * time.Hour

// ElapsedFrom converts a pull's elapsed time from a message another process sent:
// invalid or negative is 0 (unknown), beyond MaxElapsed is MaxElapsed.
func ElapsedFrom(d *durationpb.Duration) time.Duration {
	if d == nil || d.CheckValid() != nil || d.AsDuration() < 0 {
		return 0
	}
	return min(d.AsDuration(), MaxElapsed)
}
