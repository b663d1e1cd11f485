package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Recover implements runtime.Backend. Every sandbox dir with a spec.json is reported:
// Alive when its container is still running (the agent is dialable at the same socket),
// else with the Exit its agent recorded (Reason Vanished when it recorded none). Dirs of
// a Create that died before writing spec.json are removed.
func (b *Backend) Recover(ctx context.Context) ([]runtime.Recovered, error) {
	ents, err := os.ReadDir(b.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	// One `list` per runtime instead of a `state` per sandbox.
	states := map[string]map[string]containerState{}
	for class, rt := range b.runtimes {
		st, err := rt.list(ctx)
		if err != nil {
			return nil, fmt.Errorf("recover: %w", err)
		}
		states[class] = st
	}
	// Mount the volume pool an earlier run left (after a host restart, say): its sandboxes'
	// volumes are there; the captures and extractions it had in flight when it died are
	// removed.
	if b.vols.imageExists() {
		if release, err := b.vols.acquire(); err != nil {
			b.log.Warn("recover: mount the volume pool", "err", err)
		} else {
			b.vols.sweepStale(b.log)
			release()
		}
	}
	b.sweepImports() // checkpoint imports cut short (export.go)
	var out []runtime.Recovered
	for _, e := range ents {
		id := e.Name()
		if e.IsDir() && isPoolID(id) {
			// A pooled container of an earlier run nobody claimed (or whose claim did not
			// finish): it is no sandbox.
			if err := b.destroyPooled(ctx, id); err != nil {
				b.log.Warn("recover: remove pooled container", "container", id, "err", err)
			}
			continue
		}
		if !e.IsDir() || !validID(id) {
			continue
		}
		b.mu.Lock()
		s := b.sandboxes[id]
		b.mu.Unlock()
		if s == nil {
			if _, err := os.Stat(filepath.Join(b.dir(id), fileSpec)); errors.Is(err, os.ErrNotExist) {
				if err := b.Destroy(ctx, id); err != nil {
					b.log.Warn("recover: remove half-created sandbox", "sandbox", id, "err", err)
				}
				continue
			}
			var class string
			var spec runtime.Spec
			if err := readJSON(filepath.Join(b.dir(id), fileSpec), &spec); err == nil {
				class = spec.RuntimeClass
			}
			if class == "" {
				class = b.cfg.DefaultRuntime
			}
			st := states[class]
			if st == nil {
				st = map[string]containerState{}
			}
			s, err = b.load(id, st)
			if err != nil {
				// Nothing to report without a readable spec (a crash while it was written,
				// or a runtime class this runner no longer has): remove what is there.
				b.log.Warn("recover: removing a sandbox that cannot be loaded", "sandbox", id, "err", err)
				if err := b.teardownUnknown(ctx, id, spec.RuntimeClass); err != nil {
					b.log.Warn("recover: remove sandbox", "sandbox", id, "err", err)
				}
				continue
			}
			b.mu.Lock()
			if cur := b.sandboxes[id]; cur != nil {
				b.mu.Unlock()
				if s.proc != nil {
					s.proc.close()
				}
				s = cur
			} else {
				b.sandboxes[id] = s
				b.mu.Unlock()
				b.startWatch(s, "Vanished")
			}
		}
		if err := waitReady(ctx, s); err != nil {
			return nil, err
		}
		r := runtime.Recovered{Spec: s.spec, Info: s.info.toInfo(id)}
		if m := b.pausedOf(s); m != nil && (m.Released || (s.proc != nil && !s.proc.exited())) {
			// Paused (pause.go): checkpointed, or still frozen.
			r.Paused, r.Released = true, m.Released
			if b.cfg.Network != nil { // its namespace and address stay while paused
				if err := b.applyRules(s, s.cid); err != nil {
					b.log.Warn("recover: network rules", "sandbox", id, "err", err)
				}
			}
			out = append(out, r)
			continue
		}
		if s.proc != nil && !s.proc.exited() {
			r.Alive = true
			if b.cfg.Network != nil {
				if a, err := b.cfg.Network.Lookup(s.cid); err == nil && a != nil && a.IP.IsValid() {
					r.Info.IP = a.IP.String()
				}
				// The network restored the rules it had; declaring them again from the
				// spec covers state from before rules were persisted.
				if err := b.applyRules(s, s.cid); err != nil {
					b.log.Warn("recover: network rules", "sandbox", id, "err", err)
				}
			}
		} else {
			select {
			case <-s.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			ex := s.exit
			r.Exit = &ex
		}
		out = append(out, r)
	}
	// Bundles of pooled containers neither claimed by a sandbox nor pooled (a crash in
	// between): remove what is left of them.
	bundles, _ := os.ReadDir(filepath.Join(b.cfg.StateDir, poolBundles))
	for _, e := range bundles {
		cid := e.Name()
		if !isPoolID(cid) || (b.pool != nil && b.pool.owns(cid)) {
			continue
		}
		b.mu.Lock()
		used := false
		for _, s := range b.sandboxes {
			used = used || s.cid == cid
		}
		b.mu.Unlock()
		if !used {
			if err := b.destroyPooled(ctx, cid); err != nil {
				b.log.Warn("recover: remove pooled container", "container", cid, "err", err)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.ID < out[j].Spec.ID })
	return out, nil
}
