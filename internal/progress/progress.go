// Package progress is what a sandbox's start is doing now: its phase, what it waits
// for, and the byte counts of its image pulls, per layer. The runner keeps one Tracker
// per starting sandbox and hands it to the backend in the create context (With); the
// image store counts the bytes of the pulls made under that context. Watchers read
// Snapshots (bounded: at most MaxPulls pulls of at most MaxLayers layers each), so the
// size of what travels to clients does not depend on the image.
//
// It is for showing, never for control: a context without a Tracker records nothing.
package progress

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Phase is the step a sandbox's start is in.
type Phase int

const (
	PhaseUnspecified Phase = iota
	// PhaseRestoringVolumes: fetching volume snapshots the sandbox starts from.
	PhaseRestoringVolumes
	// PhasePullingImage: fetching and unpacking the image's layers.
	PhasePullingImage
	// PhaseStartingContainer: network, root file system, the container itself.
	PhaseStartingContainer
	// PhaseStartingCommand: the container runs; its main command is not running yet.
	PhaseStartingCommand
	// PhaseRunning: started (the sandbox is RUNNING); the last phase.
	PhaseRunning
	// PhaseEnded: the sandbox ended before it ran (FAILED, deleted).
	PhaseEnded
	// PhaseWaitingForRunner: the sandbox has no runner yet (PENDING).
	PhaseWaitingForRunner
)

// Waiting is what a phase waits for, in words.
func (p Phase) Waiting() string {
	switch p {
	case PhaseWaitingForRunner:
		return "waiting for a runner with room"
	case PhaseRestoringVolumes:
		return "restoring volumes from snapshots"
	case PhasePullingImage:
		return "pulling image"
	case PhaseStartingContainer:
		return "starting container"
	case PhaseStartingCommand:
		return "waiting for the main command to start"
	}
	return ""
}

// MaxLayers is the most layers one pull lists (the counts cover them all).
const MaxLayers = 16

// MaxPulls is the most image pulls a Snapshot lists (a group sandbox pulls one image
// per container).
const MaxPulls = 8

// ShortDigest is how a layer is named: the first 12 hex digits of its digest.
func ShortDigest(d string) string {
	if i := len("sha256:"); len(d) > i && d[:i] == "sha256:" {
		d = d[i:]
	}
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

// Layer is one layer's progress: compressed bytes read of Total (0: size unknown).
type Layer struct {
	Digest      string // short (ShortDigest)
	Done, Total int64
	Complete    bool
}

// Pull counts one image pull's bytes. Safe for concurrent use; a nil *Pull counts
// nothing.
type Pull struct {
	image  string
	mu     sync.Mutex
	layers []Layer
	done   []atomic.Int64
	start  time.Time
	end    time.Time // when its last layer was complete
}

// NewPull starts counting a pull of image (the reference as given).
func NewPull(image string) *Pull { return &Pull{image: image, start: time.Now()} }

// SetLayers names the pull's layers (compressed digests and sizes, bottom first).
func (p *Pull) SetLayers(digests []string, sizes []int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.layers = make([]Layer, len(digests))
	p.done = make([]atomic.Int64, len(digests))
	for i, d := range digests {
		p.layers[i] = Layer{Digest: ShortDigest(d)}
		if i < len(sizes) {
			p.layers[i].Total = max(sizes[i], 0)
		}
	}
}

// Add counts n more bytes read of layer i.
func (p *Pull) Add(i int, n int64) {
	if p == nil || i < 0 || i >= len(p.done) {
		return
	}
	p.done[i].Add(n)
}

// Complete marks layer i present (read, or found in the store).
func (p *Pull) Complete(i int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if i < 0 || i >= len(p.layers) || p.layers[i].Complete {
		return
	}
	p.layers[i].Complete = true
	for _, l := range p.layers {
		if !l.Complete {
			return
		}
	}
	p.end = time.Now()
}

// PullSnapshot is a pull as it is now.
type PullSnapshot struct {
	Image                   string
	LayersDone, LayersTotal int
	BytesDone, BytesTotal   int64 // compressed; a complete layer counts whole
	// Elapsed is how long the pull has taken: until now, or until its last layer was
	// complete.
	Elapsed time.Duration
	// Layers lists at most MaxLayers of them, those not complete first, in image order.
	Layers []Layer
}

// Snapshot returns the pull's counts now.
func (p *Pull) Snapshot() PullSnapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PullSnapshot{Image: p.image, LayersTotal: len(p.layers)}
	if p.end.IsZero() {
		s.Elapsed = time.Since(p.start)
	} else {
		s.Elapsed = p.end.Sub(p.start)
	}
	all := make([]Layer, len(p.layers))
	for i, l := range p.layers {
		l.Done = p.done[i].Load()
		if l.Complete {
			l.Done = max(l.Done, l.Total)
			s.LayersDone++
		}
		if l.Total > 0 {
			l.Done = min(l.Done, l.Total)
		}
		s.BytesDone += l.Done
		s.BytesTotal += l.Total
		all[i] = l
	}
	idx := make([]int, len(all))
	for i := range idx {
		idx[i] = i
	}
	// Not complete first (what the user waits for), then in image order.
	slices.SortStableFunc(idx, func(a, b int) int {
		ca, cb := all[a].Complete, all[b].Complete
		switch {
		case ca == cb:
			return 0
		case !ca:
			return -1
		}
		return 1
	})
	idx = idx[:min(len(idx), MaxLayers)]
	slices.Sort(idx)
	for _, i := range idx {
		s.Layers = append(s.Layers, all[i])
	}
	return s
}

// Tracker is one sandbox's start. Safe for concurrent use; the methods of a nil
// *Tracker do nothing.
type Tracker struct {
	mu      sync.Mutex
	phase   Phase
	since   time.Time
	pulls   []*Pull
	changed chan struct{}
}

// NewTracker starts tracking in phase.
func NewTracker(phase Phase) *Tracker {
	return &Tracker{phase: phase, since: time.Now(), changed: make(chan struct{})}
}

// SetPhase moves the start to phase (the same phase again changes nothing).
func (t *Tracker) SetPhase(phase Phase) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.phase == phase {
		return
	}
	t.phase, t.since = phase, time.Now()
	close(t.changed)
	t.changed = make(chan struct{})
}

// AddPull records a pull made for the sandbox (the phase is not changed). A pull
// beyond MaxPulls is counted by nobody.
func (t *Tracker) AddPull(p *Pull) {
	if t == nil || p == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pulls) < MaxPulls && !slices.Contains(t.pulls, p) {
		t.pulls = append(t.pulls, p)
	}
}

// ReplacePull puts p where old was (a pull that failed over to another source starts
// again: its bytes are counted anew), or adds p when old is not there.
func (t *Tracker) ReplacePull(old, p *Pull) {
	if t == nil || p == nil {
		return
	}
	t.mu.Lock()
	if i := slices.Index(t.pulls, old); old != nil && i >= 0 {
		t.pulls[i] = p
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	t.AddPull(p)
}

// Changed is closed at the next phase change (byte counts are read, not signalled).
func (t *Tracker) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// Snapshot is a start as it is now.
type Snapshot struct {
	Phase Phase
	Since time.Time // when the phase began
	Pulls []PullSnapshot
}

// Snapshot returns the start now.
func (t *Tracker) Snapshot() Snapshot {
	t.mu.Lock()
	s := Snapshot{Phase: t.phase, Since: t.since}
	pulls := slices.Clone(t.pulls)
	t.mu.Unlock()
	for _, p := range pulls {
		s.Pulls = append(s.Pulls, p.Snapshot())
	}
	return s
}

type key struct{}

// With returns ctx carrying t.
func With(ctx context.Context, t *Tracker) context.Context {
	return context.WithValue(ctx, key{}, t)
}

// From is ctx's Tracker, nil if none.
func From(ctx context.Context) *Tracker {
	t, _ := ctx.Value(key{}).(*Tracker)
	return t
}
