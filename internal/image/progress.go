package image

import (
	"context"
	"io"
	"slices"
	"sync/atomic"

	"github.com/sandboxd/sandboxd/internal/progress"
)

// Pull progress: every caller of Pull whose context carries a progress.Tracker is
// registered under the pull's key (the same key the flight shares one pull under), and
// the one pull that fetches layers counts its bytes into a progress.Pull every
// registered tracker sees, so callers that join a pull under way see it too.

type pullWatch struct {
	image    string // the reference as the first watcher gave it
	trackers []*progress.Tracker
	pull     *progress.Pull // set once layers are fetched
}

type pullKeyCtx struct{}

// pullStats is what one pull (a flight's) records for its metrics
// (cwsandbox_image_pulls_total): whether it went past the local cache.
type pullStats struct{ fetched atomic.Bool }

type pullStatsCtx struct{}

// watchPull registers t for the pull under key.
func (s *Store) watchPull(key, ref string, t *progress.Tracker) {
	s.pwMu.Lock()
	defer s.pwMu.Unlock()
	if s.pw == nil {
		s.pw = map[string]*pullWatch{}
	}
	w := s.pw[key]
	if w == nil {
		w = &pullWatch{image: ref}
		s.pw[key] = w
	}
	w.trackers = append(w.trackers, t)
	if w.pull != nil {
		t.AddPull(w.pull)
	}
}

// unwatchPull removes t's registration (its Pull returned).
func (s *Store) unwatchPull(key string, t *progress.Tracker) {
	s.pwMu.Lock()
	defer s.pwMu.Unlock()
	w := s.pw[key]
	if w == nil {
		return
	}
	if i := slices.Index(w.trackers, t); i >= 0 {
		w.trackers = slices.Delete(w.trackers, i, i+1)
	}
	if len(w.trackers) == 0 {
		delete(s.pw, key)
	}
}

// beginPull returns the progress of the pull ctx (a flight's) is for, shown to every
// registered tracker, or nil when nobody watches. digests and sizes are the layers'.
func (s *Store) beginPull(ctx context.Context, digests []string, sizes []int64) *progress.Pull {
	key, _ := ctx.Value(pullKeyCtx{}).(string)
	s.pwMu.Lock()
	defer s.pwMu.Unlock()
	w := s.pw[key]
	if w == nil {
		return nil
	}
	p := progress.NewPull(w.image)
	p.SetLayers(digests, sizes)
	prev := w.pull // a mirror that failed: this attempt replaces its progress
	w.pull = p
	for _, t := range w.trackers {
		t.ReplacePull(prev, p)
	}
	return p
}

// countingReader counts what is read through it.
type countingReader struct {
	r   io.Reader
	add func(int64)
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if n > 0 {
		c.add(int64(n))
	}
	return n, err
}
