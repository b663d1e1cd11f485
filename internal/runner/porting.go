package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Checkpoints through the blob store (PortHandle).
//
// An export is checkpoints/<sandbox>/<export>/<part>... then manifest.json, written last:
// a checkpoint is complete once its manifest is. An export a crash interrupted leaves
// parts without a manifest: nothing reads them (ImportFork starts from a manifest), and
// DeleteCheckpoint of the would-be manifest key removes them, as does the runner when it
// starts again (sweepExports: its own sandboxes' exports). An import a crash
// interrupted leaves nothing the runner persisted: its entries lived in memory only, so a
// restarted runner knows them no more (the gateway marks such a sandbox FAILED, reason
// Lost), or, when the backend had begun to make one, re-adopts what the backend recovers
// (a sandbox that is not alive ends FAILED, reason Vanished).

const (
	checkpointsPrefix   = "checkpoints/"
	manifestName        = "manifest.json"
	checkpointVersion   = 1
	maxManifestBytes    = 1 << 20
	maxCheckpointParts  = 64
	maxPlatformLen      = 256
	maxRunnerNameInText = 128
)

// partName is what a checkpoint part may be called (a blob key component of its own).
var partName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// sha256Hex is a lower-case hex sha256.
var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// checkpointManifest is manifest.json of an exported checkpoint.
type checkpointManifest struct {
	Version   int    `json:"version"`
	Platform  string `json:"platform"`
	Class     string `json:"class"`
	SandboxID string `json:"sandbox_id"`
	// Spec is the exported sandbox's (no pull credentials, no file contents: those are
	// in its file system by now).
	Spec        runtime.Spec     `json:"spec"`
	ImageDigest string           `json:"image_digest,omitempty"`
	Parts       []checkpointPart `json:"parts"`
	// Bytes are the parts' content before compression (runtime.CheckpointExport.Bytes).
	Bytes   int64     `json:"bytes"`
	Created time.Time `json:"created"`
}

type checkpointPart struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// porter is the backend's CheckpointPorter and its platform for runtime class class, or
// ErrCannotCheckpoint saying why there is none.
func (r *Runner) porter(class string) (runtime.CheckpointPorter, string, error) {
	if r.cfg.Blobs == nil {
		return nil, "", fmt.Errorf("%w: this runner has no blob store", ErrCannotCheckpoint)
	}
	p, ok := r.backend.(runtime.CheckpointPorter)
	if !ok {
		return nil, "", fmt.Errorf("%w: this runner's backend cannot move checkpoints to other runners", ErrCannotCheckpoint)
	}
	platform := p.CheckpointPlatform(class)
	if platform == "" {
		return nil, "", fmt.Errorf("%w: checkpoints of runtime class %q cannot move between runners on this runner", ErrCannotCheckpoint, class)
	}
	return p, platform, nil
}

// CheckpointPlatforms maps each of classes whose checkpoints the runner moves through
// the blob store to their platform (none without a blob store).
func (r *Runner) CheckpointPlatforms(classes []string) map[string]string {
	if r.cfg.Blobs == nil {
		return nil
	}
	p, ok := r.backend.(runtime.CheckpointPorter)
	if !ok {
		return nil
	}
	var out map[string]string
	for _, c := range classes {
		if pl := p.CheckpointPlatform(c); pl != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[c] = pl
		}
	}
	return out
}

// parseManifestKey checks that key is checkpoints/<sandbox>/<export>/manifest.json and
// returns the sandbox and the export's prefix.
func parseManifestKey(key string) (id, prefix string, err error) {
	rest, ok := strings.CutPrefix(key, checkpointsPrefix)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || !idPattern.MatchString(parts[0]) || !idPattern.MatchString(parts[1]) || parts[2] != manifestName {
		var vs violations
		vs.add("ref.key", "must be a checkpoint's manifest key, %smanifest.json", checkpointsPrefix+"<sandbox>/<export>/")
		return "", "", vs.err()
	}
	return parts[0], checkpointsPrefix + parts[0] + "/" + parts[1] + "/", nil
}

// ExportCheckpoint implements PortHandle for the runner.
func (r *Runner) ExportCheckpoint(ctx context.Context, id string) (CheckpointRef, Sandbox, error) {
	e, err := r.lookup(id)
	if err != nil {
		return CheckpointRef{}, Sandbox{}, err
	}
	e.op.Lock() // as a Fork: the source keeps its state through the export
	defer e.op.Unlock()
	r.mu.Lock()
	st, stop, class := e.sb.State, stopRequested(e), pauseClass(&e.sb)
	src := e.snapshot()
	r.mu.Unlock()
	if stop || st != StateRunning && st != StatePaused {
		return CheckpointRef{}, Sandbox{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, st)
	}
	if src.ImageDigest == "" {
		// A backend that reports the digest after RUNNING (runtime.LateInfoWaiter).
		late, err := r.holdForLateInfo(ctx, e)
		if err != nil {
			return CheckpointRef{}, Sandbox{}, err
		}
		src.ImageDigest = late.ImageDigest
	}
	porter, platform, err := r.porter(class)
	if err != nil {
		return CheckpointRef{}, Sandbox{}, err
	}
	start := time.Now()
	prefix := checkpointsPrefix + id + "/" + NewID() + "/"
	r.mu.Lock()
	r.exporting[prefix] = true
	r.mu.Unlock()
	defer func() { // after its manifest is written, or its parts removed
		r.mu.Lock()
		delete(r.exporting, prefix)
		r.mu.Unlock()
	}()
	var parts []checkpointPart
	var put []string // keys written, for the cleanup
	cleanup := func() {
		dctx := context.WithoutCancel(ctx)
		for _, k := range put {
			if err := r.cfg.Blobs.Delete(dctx, k); err != nil && !errors.Is(err, blob.ErrNotFound) {
				r.log.Warn("export checkpoint: remove part", "sandbox", id, "key", k, "err", err)
			}
		}
	}
	putPart := func(ctx context.Context, part string, rd io.Reader) error {
		switch {
		case !partName.MatchString(part):
			return fmt.Errorf("checkpoint part name %q: not a valid part name", textclip.Clip(part, 80))
		case len(parts) >= maxCheckpointParts:
			return fmt.Errorf("more than %d checkpoint parts", maxCheckpointParts)
		}
		for _, p := range parts {
			if p.Name == part {
				return fmt.Errorf("checkpoint part %q written twice", part)
			}
		}
		key := prefix + part
		put = append(put, key)
		info, err := r.cfg.Blobs.Put(ctx, key, rd, -1)
		if err != nil {
			return fmt.Errorf("store checkpoint part %s: %w", part, err)
		}
		parts = append(parts, checkpointPart{Name: part, Size: info.Size, SHA256: info.SHA256})
		return nil
	}
	cp, err := porter.ExportCheckpoint(ctx, id, putPart)
	if err == nil && len(parts) == 0 {
		err = errors.New("the backend wrote no checkpoint part")
	}
	if err != nil {
		cleanup()
		if errors.Is(err, errdefs.ErrNotImplemented) {
			return CheckpointRef{}, Sandbox{}, fmt.Errorf("%w: sandbox %s: %w", ErrCannotCheckpoint, id, err)
		}
		return CheckpointRef{}, Sandbox{}, fmt.Errorf("export checkpoint of %s: %w", id, err)
	}
	failpoint.Hit("runner.export.uploaded")
	if cp.Platform != "" {
		platform = cp.Platform
	}
	if class == "" {
		class = cp.Class // the runner's name of it (its Capacity's) otherwise
	}
	m := checkpointManifest{Version: checkpointVersion, Platform: platform, Class: class, SandboxID: id,
		Spec: cloneSpec(src.Spec), ImageDigest: src.ImageDigest, Parts: parts, Bytes: cp.Bytes, Created: time.Now().UTC()}
	for _, c := range m.Spec.AllContainers() {
		c.Files = withoutContents(c.Files)
	}
	var stored int64
	for _, p := range parts {
		stored += p.Size
	}
	b, err := json.Marshal(m)
	if err == nil && len(b) > maxManifestBytes {
		err = fmt.Errorf("its manifest would be %d bytes, more than %d", len(b), maxManifestBytes)
	}
	if err == nil {
		put = append(put, prefix+manifestName)
		_, err = r.cfg.Blobs.Put(ctx, prefix+manifestName, bytes.NewReader(b), int64(len(b)))
	}
	if err != nil {
		cleanup()
		return CheckpointRef{}, Sandbox{}, fmt.Errorf("export checkpoint of %s: manifest: %w", id, err)
	}
	ref := CheckpointRef{Key: prefix + manifestName, Platform: platform, Bytes: stored, Egress: cp.Egress}
	if src.State == StatePaused && src.Pause != nil && src.Pause.Released {
		r.hold(e, ref.Key)
	}
	r.log.Info("checkpoint exported", "sandbox", id, "key", ref.Key, "platform", platform, "parts", len(parts),
		"stored_bytes", stored, "bytes", cp.Bytes, "took", cp.Took, "elapsed", time.Since(start))
	return ref, r.snapshotOf(e), nil
}

// exportSweeps runs sweepExports at the start and every Config.ExportSweep.
func (r *Runner) exportSweeps() {
	t := time.NewTicker(r.cfg.ExportSweep)
	defer t.Stop()
	for {
		r.sweepExports()
		select {
		case <-t.C:
		case <-r.ctx.Done():
			return
		}
	}
}

// maxSweptObjects bounds the objects sweepExports lists under one sandbox.
const maxSweptObjects = 16 * maxCheckpointParts

// sweepExports removes what exports of this runner's sandboxes that an earlier process
// did not finish (it was killed) left in the blob store: parts without a manifest, which
// nothing reads and nobody else knows. It also removes complete exports older than
// Config.ExportMaxAge (of sandboxes here, running or ended but not yet forgotten): an
// export serves one move or fork, which deletes it; an old one was left by a gateway
// that died before it could. Only the runner a sandbox is on exports it, so manifest-less
// parts written before this process started are garbage; an export of this process
// (exporting), or one whose manifest is there by the time of the delete, is left alone
// unless it is that old.
func (r *Runner) sweepExports() {
	if r.cfg.Blobs == nil {
		return
	}
	r.mu.Lock()
	var ids []string
	for id := range r.sandboxes { // running or ended, not yet forgotten
		ids = append(ids, id)
	}
	r.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		if r.ctx.Err() != nil {
			return
		}
		type export struct {
			keys     []string
			manifest bool
			recent   bool
			newest   time.Time // of its objects; zero when the store does not say
			unknown  bool      // an object without a time
		}
		exports := map[string]*export{}
		n := 0
		for info, err := range r.cfg.Blobs.List(r.ctx, checkpointsPrefix+id+"/") {
			if err != nil {
				r.log.Warn("sweep unfinished checkpoint exports: list", "sandbox", id, "err", err)
				break
			}
			rest := strings.TrimPrefix(info.Key, checkpointsPrefix+id+"/")
			exp, name, ok := strings.Cut(rest, "/")
			if !ok || !idPattern.MatchString(exp) {
				continue
			}
			prefix := checkpointsPrefix + id + "/" + exp + "/"
			x := exports[prefix]
			if x == nil {
				x = &export{}
				exports[prefix] = x
			}
			x.keys = append(x.keys, info.Key)
			x.manifest = x.manifest || name == manifestName
			x.recent = x.recent || !info.ModTime.IsZero() && !info.ModTime.Before(r.started)
			x.unknown = x.unknown || info.ModTime.IsZero()
			if info.ModTime.After(x.newest) {
				x.newest = info.ModTime
			}
			if n++; n >= maxSweptObjects {
				break // the rest with the next start
			}
		}
		for prefix, x := range exports {
			r.mu.Lock()
			mine := r.exporting[prefix]
			r.mu.Unlock()
			stale := x.manifest && !x.unknown && time.Since(x.newest) > r.cfg.ExportMaxAge
			switch {
			case mine:
				continue
			case stale: // complete, and left by a move or fork that never deleted it
			case x.manifest || x.recent:
				continue
			default:
				if _, err := r.cfg.Blobs.Stat(r.ctx, prefix+manifestName); !errors.Is(err, blob.ErrNotFound) {
					continue // completed meanwhile, or the store cannot say
				}
			}
			if stale {
				r.unhold(id, prefix+manifestName)
			}
			for _, k := range x.keys {
				if err := r.cfg.Blobs.Delete(r.ctx, k); err != nil && !errors.Is(err, blob.ErrNotFound) {
					r.log.Warn("sweep unfinished checkpoint exports: delete", "key", k, "err", err)
				}
			}
			r.log.Info("unfinished or stale checkpoint export removed", "sandbox", id, "prefix", prefix, "objects", len(x.keys), "complete", x.manifest)
		}
	}
}

// readManifest reads and checks the manifest at key (from its prefix's sandbox).
func (r *Runner) readManifest(ctx context.Context, key string) (*checkpointManifest, error) {
	id, _, err := parseManifestKey(key)
	if err != nil {
		return nil, err
	}
	rc, err := r.cfg.Blobs.Get(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, fmt.Errorf("%w: no checkpoint %s", runtime.ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint manifest %s: %w", key, err)
	}
	defer func() { _ = rc.Close() }()
	b, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read checkpoint manifest %s: %w", key, err)
	case len(b) > maxManifestBytes:
		return nil, badManifest(key, "more than %d bytes", maxManifestBytes)
	}
	var m checkpointManifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, badManifest(key, "%v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, badManifest(key, "data after the document")
	}
	switch {
	case m.Version != checkpointVersion:
		return nil, badManifest(key, "version %d, this runner reads version %d", m.Version, checkpointVersion)
	case m.Platform == "" || len(m.Platform) > maxPlatformLen:
		return nil, badManifest(key, "no platform, or one longer than %d bytes", maxPlatformLen)
	case m.SandboxID != id:
		return nil, badManifest(key, "it is of sandbox %q, its key of %s", textclip.Clip(m.SandboxID, 80), id)
	case len(m.Parts) == 0 || len(m.Parts) > maxCheckpointParts:
		return nil, badManifest(key, "%d parts, 1 to %d allowed", len(m.Parts), maxCheckpointParts)
	case m.Bytes < 0:
		return nil, badManifest(key, "negative bytes")
	}
	seen := map[string]bool{}
	for i, p := range m.Parts {
		switch {
		case !partName.MatchString(p.Name) || seen[p.Name]:
			return nil, badManifest(key, "part %d: invalid or repeated name %q", i, textclip.Clip(p.Name, 80))
		case p.Size < 0:
			return nil, badManifest(key, "part %s: negative size", p.Name)
		case !sha256Hex.MatchString(p.SHA256):
			return nil, badManifest(key, "part %s: sha256 is not 64 lower-case hex digits", p.Name)
		}
		seen[p.Name] = true
	}
	return &m, nil
}

func badManifest(key, format string, args ...any) error {
	return fmt.Errorf("%w: checkpoint manifest %s is invalid: %s", ErrCannotCheckpoint, key, fmt.Sprintf(format, args...))
}

// sameSandbox checks that the manifest is of sandbox src as the caller described it
// (as its runner reported it at the export): same ID, the very same spec (its file
// contents and pull credentials aside, which neither carries), runtime class and image
// digest. The manifest's spec is what the backend is given: it must be the one the
// caller (and this runner's policy) checked, not another one written to the store.
func sameSandbox(m *checkpointManifest, src *Sandbox) error {
	var diff []string
	if m.SandboxID != src.ID {
		diff = append(diff, fmt.Sprintf("sandbox %s, not %s", m.SandboxID, src.ID))
	}
	if fields := specDiff(m.Spec, src.Spec); len(fields) > 0 {
		diff = append(diff, "spec fields differ: "+strings.Join(fields, ", "))
	}
	if c := pauseClass(src); c != "" && c != m.Class {
		diff = append(diff, fmt.Sprintf("checkpoint of class %q, not %q", m.Class, c))
	}
	if src.ImageDigest != "" && src.ImageDigest != m.ImageDigest {
		diff = append(diff, fmt.Sprintf("image digest %s, not %s", m.ImageDigest, src.ImageDigest))
	}
	if len(diff) == 0 {
		return nil
	}
	var vs violations
	vs.add("source", "the checkpoint is not of this sandbox: %s", strings.Join(diff, "; "))
	return vs.err()
}

// specDiff names the (JSON) fields in which a and b differ, file contents, pull
// credentials and disk limits aside; none when they are the same spec. A disk limit
// (Resources.DiskBytes) is the runner's own setting (its --disk), which no wire field
// carries: a runner restarted since the create reports the one its backend recorded,
// the gateway's copy of the spec has none.
func specDiff(a, b runtime.Spec) []string {
	fields := func(s runtime.Spec) map[string]json.RawMessage {
		s = cloneSpec(s)
		for _, c := range s.AllContainers() {
			c.Files = withoutContents(c.Files)
			c.Resources.DiskBytes = 0
		}
		var out map[string]json.RawMessage
		if raw, err := json.Marshal(s); err == nil {
			_ = json.Unmarshal(raw, &out)
		}
		return out
	}
	fa, fb := fields(a), fields(b)
	var diff []string
	for k, v := range fa {
		if w, ok := fb[k]; !ok || !bytes.Equal(v, w) {
			diff = append(diff, k)
		}
	}
	for k := range fb {
		if _, ok := fa[k]; !ok {
			diff = append(diff, k)
		}
	}
	slices.Sort(diff)
	return diff
}

// ImportFork implements PortHandle for the runner.
func (r *Runner) ImportFork(ctx context.Context, req ImportRequest) ([]ForkResult, error) {
	return r.importFork(ctx, req, func() {})
}

// importFork is ImportFork; registered is called once, when the new sandboxes count in
// List (or the call failed before): the end of Local's admission.
func (r *Runner) importFork(ctx context.Context, req ImportRequest, registered func()) ([]ForkResult, error) {
	start := time.Now()
	var once sync.Once
	done := func() { once.Do(registered) }
	defer done()
	if r.cfg.Blobs == nil {
		return nil, fmt.Errorf("%w: this runner has no blob store", ErrCannotCheckpoint)
	}
	if _, _, err := parseManifestKey(req.Ref.Key); err != nil {
		return nil, err
	}
	if err := r.validateForks(req.Targets); err != nil {
		return nil, err
	}
	if req.Move && (len(req.Targets) != 1 || req.Targets[0].ID != req.Source.ID) {
		var vs violations
		vs.add("targets", "a move has one target, with the source's ID %s", req.Source.ID)
		return nil, vs.err()
	}
	m, err := r.readManifest(ctx, req.Ref.Key)
	if err != nil {
		return nil, err
	}
	porter, mine, err := r.porter(m.Class)
	if err != nil {
		return nil, err
	}
	if m.Platform != req.Ref.Platform || m.Platform != mine {
		return nil, fmt.Errorf("%w: the checkpoint of %s was made on platform %q (the caller said %q); this runner restores checkpoints of runtime class %q on platform %q",
			ErrCannotCheckpoint, m.SandboxID, m.Platform, req.Ref.Platform, m.Class, mine)
	}
	if err := sameSandbox(m, &req.Source); err != nil {
		return nil, err
	}
	// The egress secrets' CA and placeholders, as the export handed them over the wire.
	caExpiry, err := checkEgressState(&m.Spec, req.Ref.Egress)
	if err != nil {
		return nil, err
	}

	now := time.Now()
	specs := make([]*runtime.Spec, len(req.Targets))
	entries := make([]*entry, len(req.Targets))
	var outlive []apierr.Violation
	for i, t := range req.Targets {
		spec := cloneSpec(m.Spec)
		spec.ID = t.ID
		spec.Image = pinImage(spec.Image, m.ImageDigest)
		sb := Sandbox{ID: t.ID, State: StateCreating, RuntimeClass: m.Class, ImageDigest: m.ImageDigest}
		if req.Move {
			// It is the source, now here: what it had it keeps.
			sb.CreatedAt, sb.Lifetime, sb.Deadline = req.Source.CreatedAt, req.Source.Lifetime, req.Source.Deadline
			if sb.CreatedAt.IsZero() {
				sb.CreatedAt = now
			}
			if sb.Lifetime <= 0 {
				sb.Lifetime = DefaultLifetime
			}
			if ps := req.Source.Pause; ps != nil && ps.LifetimeHeld && !ps.PausedAt.IsZero() {
				sb.Lifetime += max(now.Sub(ps.PausedAt), 0) // as Resume does
			}
			if sb.Deadline.IsZero() || req.Source.Pause != nil && req.Source.Pause.LifetimeHeld {
				sb.Deadline = sb.CreatedAt.Add(sb.Lifetime)
			}
			if spec.Meta == nil {
				spec.Meta = map[string]string{}
			}
			// Its organization is the caller's (the gateway's record), not the
			// manifest's: the exporting runner wrote that.
			if org := t.Meta[runtime.MetaOrg]; org != "" {
				spec.Meta[runtime.MetaOrg] = org
			}
		} else {
			spec.ShareTokenHash = t.ShareTokenHash
			lifetime := t.Lifetime
			if lifetime <= 0 {
				lifetime = req.Source.Lifetime
			}
			if lifetime <= 0 {
				lifetime = DefaultLifetime
			}
			spec.Meta = maps.Clone(t.Meta)
			if spec.Meta == nil {
				spec.Meta = map[string]string{}
			}
			spec.Meta[runtime.MetaForkedFrom] = m.SandboxID
			spec.Meta[runtime.MetaCreatedAt] = now.UTC().Format(time.RFC3339Nano)
			spec.Meta[runtime.MetaLifetime] = lifetime.String()
			sb.CreatedAt, sb.Lifetime, sb.Deadline = now, lifetime, now.Add(lifetime)
		}
		// A fork here is a new sandbox here: checked as a Create is.
		cr := CreateRequest{Spec: cloneSpec(spec), Lifetime: min(sb.Lifetime, MaxLifetime)}
		if err := validate(&cr); err != nil {
			return nil, err
		}
		if err := supported(spec.Network, r.Support()); err != nil {
			return nil, err
		}
		if err := r.checkUnreserved(spec.Network); err != nil {
			return nil, err
		}
		sb.Spec = cloneSpec(spec)
		// The egress secrets' values, resolved again by the gateway: checked as a
		// create's, handed to the backend only.
		spec.EgressSecretValues = maps.Clone(t.EgressSecretValues)
		if len(spec.EgressSecretValues) > 0 || len(spec.Network.EgressSecrets()) > 0 {
			if err := checkEgressSecrets(&spec); err != nil {
				return nil, err
			}
		}
		// The CA the sandbox keeps must outlive it (as Fork checks on the source's runner).
		if !caExpiry.IsZero() && caExpiry.Before(sb.Deadline) {
			outlive = append(outlive, apierr.Violation{Field: fmt.Sprintf("targets[%d].lifetime", i),
				Description: fmt.Sprintf("the sandbox's lifetime ends at %s, after its egress CA, which it keeps, expires at %s",
					sb.Deadline.UTC().Format(time.RFC3339), caExpiry.UTC().Format(time.RFC3339))})
		}
		specs[i] = &spec
		entries[i] = newEntry(sb)
	}
	if len(outlive) > 0 {
		return nil, egressCAExpiresError(m.SandboxID, caExpiry, outlive)
	}
	if err := r.addForks(entries); err != nil {
		return nil, err
	}
	done()
	if req.Move {
		// The lifetime the backend's spec records is the create's; a restarted runner
		// takes this one (as after UpdateLifetime).
		if d, err := time.ParseDuration(m.Spec.Meta[runtime.MetaLifetime]); err != nil || d != entries[0].sb.Lifetime {
			if err := writeFileAtomic(r.lifetimePath(req.Source.ID), []byte(entries[0].sb.Lifetime.String())); err != nil {
				r.log.Warn("persist lifetime (a restarted runner takes the create's)", "sandbox", req.Source.ID, "err", err)
			}
		}
	}
	failpoint.Hit("runner.import.created")

	_, prefix, _ := parseManifestKey(req.Ref.Key)
	open := func(ctx context.Context, part string) (io.ReadCloser, error) {
		var want *checkpointPart
		for i := range m.Parts {
			if m.Parts[i].Name == part {
				want = &m.Parts[i]
			}
		}
		if want == nil {
			return nil, fmt.Errorf("checkpoint %s has no part %q", req.Ref.Key, textclip.Clip(part, 80))
		}
		info, err := r.cfg.Blobs.Stat(ctx, prefix+part)
		if err != nil {
			return nil, fmt.Errorf("checkpoint part %s: %w", part, err)
		}
		if info.Size != want.Size || info.SHA256 != want.SHA256 {
			return nil, fmt.Errorf("checkpoint part %s: stored %d bytes with sha256 %s, the manifest says %d bytes with sha256 %s",
				part, info.Size, info.SHA256, want.Size, want.SHA256)
		}
		return r.cfg.Blobs.Get(ctx, prefix+part)
	}
	cp := runtime.CheckpointExport{Platform: m.Platform, Class: m.Class, Bytes: m.Bytes, Egress: req.Ref.Egress}
	for _, p := range m.Parts {
		cp.Parts = append(cp.Parts, p.Name)
	}
	infos, errs := porter.ForkFromCheckpoint(context.WithoutCancel(ctx), cp, open, specs)
	what := "fork"
	if req.Move {
		what = "move"
	}
	out := r.startForks(m.SandboxID, what, entries, infos, errs)
	if req.Move && out[0].Err != nil {
		// The source stays where it was: nothing of it is left here.
		r.forget(req.Source.ID, entries[0])
	}
	r.log.Info("checkpoint imported", "sandbox", m.SandboxID, "key", req.Ref.Key, "move", req.Move, "targets", len(req.Targets), "elapsed", time.Since(start))
	return out, nil
}

// DeleteCheckpoint implements PortHandle for the runner: the manifest first (a
// checkpoint without one is incomplete to every reader), then every part.
func (r *Runner) DeleteCheckpoint(ctx context.Context, key string) error {
	if r.cfg.Blobs == nil {
		return fmt.Errorf("%w: this runner has no blob store", ErrCannotCheckpoint)
	}
	id, prefix, err := parseManifestKey(key)
	if err != nil {
		return err
	}
	defer r.unhold(id, key) // also when the objects are gone already
	if err := r.cfg.Blobs.Delete(ctx, key); err != nil && !errors.Is(err, blob.ErrNotFound) {
		return fmt.Errorf("delete checkpoint %s: %w", key, err)
	}
	var keys []string
	for info, err := range r.cfg.Blobs.List(ctx, prefix) {
		if err != nil {
			return fmt.Errorf("delete checkpoint %s: list: %w", key, err)
		}
		keys = append(keys, info.Key)
		if len(keys) > 4*maxCheckpointParts {
			break // more than any export writes: the rest goes with the next delete
		}
	}
	for _, k := range keys {
		if err := r.cfg.Blobs.Delete(ctx, k); err != nil && !errors.Is(err, blob.ErrNotFound) {
			return fmt.Errorf("delete checkpoint %s: %w", key, err)
		}
	}
	r.log.Info("checkpoint deleted", "key", key, "objects", len(keys)+1)
	return nil
}

// movedDir (in DataDir) holds one empty file per sandbox that moved away (Moved) until it
// is forgotten: a runner restarted meanwhile destroys it rather than re-adopt it.
const movedDir = "moved"

func (r *Runner) movedPath(id string) string {
	return filepath.Join(r.cfg.DataDir, movedDir, id)
}

// Moved implements PortHandle for the runner.
func (r *Runner) Moved(ctx context.Context, id, to string) error {
	e, err := r.lookup(id)
	if err != nil {
		return err
	}
	e.op.Lock()
	r.mu.Lock()
	if e.sb.State != StatePaused || stopRequested(e) {
		st := e.sb.State
		r.mu.Unlock()
		e.op.Unlock()
		return fmt.Errorf("%w: %s is %s (only a paused sandbox moves)", ErrNotRunning, id, st)
	}
	if err := writeFileAtomic(r.movedPath(id), nil); err != nil {
		r.mu.Unlock()
		e.op.Unlock()
		return fmt.Errorf("runner: persist move: %w", err)
	}
	e.movedTo = textclip.Clip(to, maxRunnerNameInText)
	r.requestStopLocked(e, ReasonMoved, 0)
	e.sb.State = StateTerminating
	r.notifyLocked(e)
	r.mu.Unlock()
	e.op.Unlock()
	select {
	case <-e.done:
	case <-ctx.Done():
		// It ends all the same; forgotten once it has (or by the next runner).
		go func() {
			select {
			case <-e.done:
				r.forgetMoved(id, e)
			case <-r.ctx.Done():
			}
		}()
		return ctx.Err()
	}
	r.forgetMoved(id, e)
	return nil
}

// forgetMoved forgets e, which moved away, at once.
func (r *Runner) forgetMoved(id string, e *entry) {
	r.mu.Lock()
	if e.forget != nil {
		e.forget.Stop()
	}
	r.mu.Unlock()
	r.forget(id, e)
	_ = os.Remove(r.movedPath(id))
	r.log.Info("moved sandbox forgotten", "sandbox", id, "to", e.movedTo)
}

// movedAway are the sandboxes an earlier runner was told moved away (Moved) but had not
// forgotten yet: their records are removed now, and recover destroys them.
func (r *Runner) movedAway() map[string]bool {
	ents, _ := os.ReadDir(filepath.Join(r.cfg.DataDir, movedDir))
	out := map[string]bool{}
	for _, ent := range ents {
		id := ent.Name()
		if !idPattern.MatchString(id) {
			_ = os.Remove(filepath.Join(r.cfg.DataDir, movedDir, id))
			continue
		}
		out[id] = true
		r.mu.Lock()
		if e := r.sandboxes[id]; e != nil { // its ended record, taken back by recoverEnded
			if e.forget != nil {
				e.forget.Stop()
			}
			delete(r.sandboxes, id)
		}
		r.mu.Unlock()
		r.forgetFiles(id)
	}
	return out
}

// pinImage is image pinned to digest (image@digest, any earlier pin replaced): a
// checkpoint is restored only onto the very files it was taken on, never onto what a
// tag names now. An empty digest leaves image as it is (the backend refuses an unpinned
// image when it needs one).
func pinImage(image, digest string) string {
	if digest == "" {
		return image
	}
	if i := strings.LastIndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	return image + "@" + digest
}

// Holds. Exporting a checkpointed sandbox's checkpoint may be the first step of its move
// to another runner (ResumeSandbox elsewhere): from then until the gateway has either
// told this runner it moved (Moved) or given up (DeleteCheckpoint of the export), an
// auto-resume here — endpoint traffic to its old host name, a call the gateway routed
// before the move — would make a second running copy. So Resume waits while the export
// is held, and then finds it moved (TERMINATING, forgotten: the caller follows the
// gateway to the new runner) or still paused (resumed here as usual). A hold lapses
// after maxHold, should the gateway never come back. Forks from a checkpointed source
// hold it too (until their export is deleted): its auto-resume waits for their imports.

// maxHold bounds how long an export holds its sandbox paused.
const maxHold = 5 * time.Minute

// hold marks e's export key held.
func (r *Runner) hold(e *entry, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.holds == nil {
		e.holds = map[string]time.Time{}
	}
	e.holds[key] = time.Now().Add(maxHold)
}

// unhold ends the hold of sandbox id's export key, if any, and wakes its waiters.
func (r *Runner) unhold(id, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.sandboxes[id]
	if e == nil || e.holds[key].IsZero() {
		return
	}
	delete(e.holds, key)
	r.notifyLocked(e)
}

// waitHolds waits until no export holds e (lapsed ones are dropped).
func (r *Runner) waitHolds(ctx context.Context, e *entry) error {
	for {
		r.mu.Lock()
		if e.sb.State != StatePaused { // moved (Moved) or ended: Resume says so
			r.mu.Unlock()
			return nil
		}
		now, until := time.Now(), time.Time{}
		for k, t := range e.holds {
			if !now.Before(t) {
				delete(e.holds, k)
				continue
			}
			if t.After(until) {
				until = t
			}
		}
		ch := e.changed
		r.mu.Unlock()
		if until.IsZero() {
			return nil
		}
		timer := time.NewTimer(time.Until(until))
		select {
		case <-ch:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("sandbox %s is being moved to another runner: %w", e.sb.ID, ctx.Err())
		}
		timer.Stop()
	}
}
