package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// GLOBAL registered volumes (docs/volumes.md): the volume's content lives in the blob
// store, as numbered generations under a prefix (GlobalVolumePrefix):
//
//	volumes/<org hash>/<claim>/manifest.json          the committed generation, written last
//	volumes/<org hash>/<claim>/<generation>/<writer>.fsa its archive (fsarchive; none for an empty one)
//
// A sandbox mounting the volume gets a sized scratch volume (runtime.Volume.Global)
// restored from the manifest's archive. The sandbox holding the write lease has its copy
// uploaded as the next generation when it ends: once its containers have stopped and
// before it is destroyed and reported ended (commitGlobals), the runner archives the
// copy, stores it, writes the manifest and deletes generations older than the previous
// one (a copy being restored from the previous one keeps it). A failed or lost upload (a
// runner crash) leaves the previous generation committed. Each writer's archive has a key
// of its own (its sandbox's ID): two writers racing for one generation (a lease taken
// over from a holder its runner was cut off from) never write one object, so the
// manifest, written last, always names an archive that matches it; one of the two
// sessions' writes is lost then, never the volume.

const (
	// GlobalManifestName is the manifest's name under a GLOBAL volume's prefix.
	GlobalManifestName = "manifest.json"
	// GlobalArchiveSuffix ends a generation's archive, <prefix><generation>/<writer>.fsa.
	GlobalArchiveSuffix = ".fsa"
	// DefaultGlobalVolumeBytes is a GLOBAL volume's size (each copy's scratch volume and
	// the bound of its archive), as local.DefaultManagedVolumeBytes for CLUSTER_LOCAL ones.
	DefaultGlobalVolumeBytes = 10 << 30
	// maxGlobalManifestBytes bounds a manifest read back.
	maxGlobalManifestBytes = 64 << 10
	// globalCommitTimeout bounds one upload of a writer's copy.
	globalCommitTimeout = 30 * time.Minute
)

// GlobalManifest is a GLOBAL volume's committed generation.
type GlobalManifest struct {
	Generation int64 `json:"generation"`
	// BlobKey is the generation's archive; "" for an empty volume (generation 0).
	BlobKey      string    `json:"blob_key,omitempty"`
	Digest       string    `json:"digest,omitempty"`        // hex sha256 of the archive
	SizeBytes    int64     `json:"size_bytes,omitempty"`    // the archive's size
	ContentBytes int64     `json:"content_bytes,omitempty"` // sum of its files' sizes
	Files        int64     `json:"files,omitempty"`
	SandboxID    string    `json:"sandbox_id,omitempty"` // who wrote it
	CommitTime   time.Time `json:"commit_time"`
}

// GlobalVolumePrefix is where org's GLOBAL volume claim lives in the blob store: the
// organization by hash (any string is safe), the claim a DNS-1123 label.
func GlobalVolumePrefix(org, claim string) string {
	sum := sha256.Sum256([]byte(org))
	return "volumes/" + hex.EncodeToString(sum[:16]) + "/" + claim + "/"
}

// GlobalArchiveKey is generation gen's archive under prefix as writer (a sandbox ID)
// uploads it.
func GlobalArchiveKey(prefix string, gen int64, writer string) string {
	return prefix + strconv.FormatInt(gen, 10) + "/" + writer + GlobalArchiveSuffix
}

// archiveWriterPattern is the writer part of an archive's key: a sandbox ID's characters.
var archiveWriterPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// isGenerationArchive says whether key is one of generation gen's archives under prefix.
func isGenerationArchive(prefix string, gen int64, key string) bool {
	rest, ok := strings.CutPrefix(key, prefix+strconv.FormatInt(gen, 10)+"/")
	if !ok {
		return false
	}
	writer, ok := strings.CutSuffix(rest, GlobalArchiveSuffix)
	return ok && archiveWriterPattern.MatchString(writer)
}

// ReadGlobalManifest reads the committed generation under prefix (blob.ErrNotFound when
// none was ever written). The manifest is checked: a bad one is an error, never used.
func ReadGlobalManifest(ctx context.Context, st blob.Store, prefix string) (GlobalManifest, error) {
	var m GlobalManifest
	rc, err := st.Get(ctx, prefix+GlobalManifestName)
	if err != nil {
		return m, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxGlobalManifestBytes+1))
	if err != nil {
		return m, fmt.Errorf("read the volume's manifest: %w", err)
	}
	if len(b) > maxGlobalManifestBytes {
		return m, fmt.Errorf("the volume's manifest is larger than %d bytes", maxGlobalManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("the volume's manifest: %w", err)
	}
	switch {
	case m.Generation < 0:
		return m, fmt.Errorf("the volume's manifest: negative generation %d", m.Generation)
	case m.BlobKey == "" && (m.Digest != "" || m.SizeBytes != 0):
		return m, errors.New("the volume's manifest: an archive digest without an archive")
	case m.BlobKey != "" && !isGenerationArchive(prefix, m.Generation, m.BlobKey):
		return m, fmt.Errorf("the volume's manifest names archive %q, not its generation's", m.BlobKey)
	case m.BlobKey != "" && (!digestPattern.MatchString(m.Digest) || m.SizeBytes <= 0 || m.ContentBytes < 0):
		return m, errors.New("the volume's manifest: bad archive digest or sizes")
	}
	return m, nil
}

// WriteGlobalManifest commits m under prefix.
func WriteGlobalManifest(ctx context.Context, st blob.Store, prefix string, m GlobalManifest) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = st.Put(ctx, prefix+GlobalManifestName, bytes.NewReader(b), int64(len(b)))
	return err
}

// Source is the restore of the manifest's generation (ok false for an empty volume).
func (m GlobalManifest) Source(volumeID string) (SnapshotSource, bool) {
	if m.BlobKey == "" {
		return SnapshotSource{}, false
	}
	return SnapshotSource{SnapshotID: fmt.Sprintf("volume-%s-g%d", volumeID, m.Generation), BlobKey: m.BlobKey, Digest: m.Digest,
		SizeBytes: m.SizeBytes, ContentBytes: m.ContentBytes}, true
}

// DeleteGlobalVolume deletes every object under prefix (the manifest first, so a
// half-deleted volume has no committed generation).
func DeleteGlobalVolume(ctx context.Context, st blob.Store, prefix string) error {
	if err := st.Delete(ctx, prefix+GlobalManifestName); err != nil && !errors.Is(err, blob.ErrNotFound) {
		return err
	}
	var keys []string
	for info, err := range st.List(ctx, prefix) {
		if err != nil {
			return err
		}
		keys = append(keys, info.Key)
	}
	for _, k := range keys {
		if err := st.Delete(ctx, k); err != nil && !errors.Is(err, blob.ErrNotFound) {
			return err
		}
	}
	return nil
}

// pruneGlobalGenerations deletes the archives under prefix of generations before keep-1:
// the committed one (keep) and the one before it stay (a copy restored from the previous
// manifest may still be reading it); so do other archives of generation keep (one that
// raced for it and lost, or won after this call's manifest: the next commits remove it).
func pruneGlobalGenerations(ctx context.Context, st blob.Store, prefix string, keep int64) error {
	var stale []string
	for info, err := range st.List(ctx, prefix) {
		if err != nil {
			return err
		}
		rest := strings.TrimPrefix(info.Key, prefix)
		gen, _, ok := strings.Cut(rest, "/")
		if !ok {
			continue // the manifest
		}
		if n, err := strconv.ParseInt(gen, 10, 64); err == nil && n >= keep-1 {
			continue
		}
		stale = append(stale, info.Key)
	}
	for _, k := range stale {
		if err := st.Delete(ctx, k); err != nil && !errors.Is(err, blob.ErrNotFound) {
			return err
		}
	}
	return nil
}

// checkGlobals refuses a spec with GLOBAL volume copies this runner cannot serve.
func (r *Runner) checkGlobals(spec *runtime.Spec) error {
	var sup runtime.Support
	if b, ok := r.backend.(runtime.SupportReporter); ok {
		sup = b.Support()
	}
	for _, v := range spec.Volumes {
		if v.Global == nil {
			continue
		}
		if err := blob.ValidatePrefix(v.Global.BlobPrefix); err != nil {
			return apierr.Newf(apierr.InvalidRequest, "volume %q: GLOBAL volume prefix: %v", v.Name, err)
		}
		if r.cfg.Blobs == nil {
			return apierr.Newf(apierr.VolumeTypeNotSupported, "volume %q is GLOBAL, and this runner has no blob store to sync it with", v.Name)
		}
		if sup.NoGlobalVolumes {
			// Read-only too: refused here rather than failing the sandbox when its copy
			// cannot be filled (Support.NoGlobalVolumes: placement sends it elsewhere).
			return apierr.Newf(apierr.VolumeTypeNotSupported, "volume %q is GLOBAL, and this runner's backend cannot hold GLOBAL volumes (mount it on another runner)", v.Name)
		}
		if sup.NoGlobalVolumeSubPaths {
			for _, c := range spec.AllContainers() {
				for _, m := range c.VolumeMounts {
					if m.Volume == v.Name && m.SubPath != "" {
						return apierr.Newf(apierr.VolumeTypeNotSupported, "volume %q is GLOBAL and container %q mounts its sub_path %q: this runner's backend mounts a GLOBAL volume's root only (drop the sub_path, of the mount or of the registered volume, or mount it on another runner)", v.Name, c.ContainerName(), m.SubPath)
					}
				}
			}
		}
		if v.Global.CommitGeneration == 0 {
			continue
		}
		if sup.NoGlobalVolumeWriters {
			return apierr.Newf(apierr.VolumeTypeNotSupported, "volume %q is GLOBAL and mounted read-write: this runner's backend mounts GLOBAL volumes read-only only, it cannot commit a writer's copy (mount it read-only, or read-write on another runner)", v.Name)
		}
		_, ok := r.backend.(runtime.VolumeCapturer)
		if !ok || r.capturesOnlyLive() {
			return apierr.Newf(apierr.VolumeTypeNotSupported, "volume %q is GLOBAL: this runner's backend cannot upload a writer's copy when the sandbox ends (mount it read-only, or on another runner)", v.Name)
		}
	}
	return nil
}

// capturesOnlyLive reports whether the backend captures volumes only while the sandbox
// runs (runtime.LiveCapturer), and not a GLOBAL writer's copy after its workload
// stopped either (runtime.StoppedGlobalCapturer): then it cannot commit a writer.
func (r *Runner) capturesOnlyLive() bool {
	lc, live := r.backend.(runtime.LiveCapturer)
	if !live || !lc.CapturesLive() {
		return false
	}
	sc, ok := r.backend.(runtime.StoppedGlobalCapturer)
	return !ok || !sc.CapturesStoppedGlobals()
}

// podArchives reports whether the backend's archives are made inside the sandbox
// (runtime.LiveCapturer: through an agent), not by the runner on the host: the runner
// checks them (fsarchive.Check) before it commits one.
func (r *Runner) podArchives() bool {
	lc, live := r.backend.(runtime.LiveCapturer)
	return live && lc.CapturesLive()
}

// commitGlobals uploads the GLOBAL volume copies sandbox id holds the write lease of as
// their next generations (its containers have stopped; it is not yet destroyed). What
// fails is logged and leaves the previous generation committed.
func (r *Runner) commitGlobals(id string, spec runtime.Spec) {
	for _, v := range spec.Volumes {
		if v.Global == nil || v.Global.CommitGeneration <= 0 {
			continue
		}
		start := time.Now()
		m, err := r.commitGlobal(id, v)
		if err != nil {
			r.log.Warn("GLOBAL volume not committed: the previous generation stays", "sandbox", id, "volume", v.Name, "err", err)
			continue
		}
		r.log.Info("GLOBAL volume committed", "sandbox", id, "volume", v.Name, "generation", m.Generation,
			"archive_bytes", m.SizeBytes, "content_bytes", m.ContentBytes, "took", time.Since(start).Round(time.Millisecond))
	}
}

func (r *Runner) commitGlobal(id string, v runtime.Volume) (GlobalManifest, error) {
	g := v.Global
	vc, ok := r.backend.(runtime.VolumeCapturer)
	if !ok || r.cfg.Blobs == nil {
		return GlobalManifest{}, errors.New("this runner cannot upload volumes")
	}
	ctx, cancel := context.WithTimeout(r.ctx, globalCommitTimeout)
	defer cancel()
	// Only on top of the generation the copy started from: a volume deleted meanwhile (a
	// forced delete) or committed by another writer (a lease taken over from a holder
	// its runner was cut off from) keeps what it has.
	if err := checkGlobalBase(ctx, r.cfg.Blobs, g); err != nil {
		return GlobalManifest{}, err
	}
	c, err := vc.CaptureVolume(ctx, id, v.Name)
	if err != nil {
		return GlobalManifest{}, fmt.Errorf("capture: %w", err)
	}
	defer func() { _ = c.Close() }()
	key := GlobalArchiveKey(g.BlobPrefix, g.CommitGeneration, id)
	limit := g.MaxSizeBytes
	if limit <= 0 {
		limit = v.SizeBytes
	}
	pr, pw := io.Pipe()
	cw := &countingWriter{w: pw, h: sha256.New(), max: limit}
	var (
		stats   runtime.ArchiveStats
		archErr error
		written = make(chan struct{})
		// An archive made in the sandbox's Pod (podArchives) is untrusted: read back as
		// it is uploaded (fsarchive.Check: format, entries, the files' total size within
		// the volume's), and its statistics are the runner's count, not the Pod's word.
		check    = r.podArchives()
		chkW     *io.PipeWriter
		chkStats runtime.ArchiveStats
		chkErr   error
		checked  = make(chan struct{})
	)
	dst := io.Writer(cw)
	if check {
		var chkR *io.PipeReader
		chkR, chkW = io.Pipe()
		dst = io.MultiWriter(cw, chkW)
		go func() {
			defer close(checked)
			chkStats, chkErr = fsarchive.Check(ctx, chkR, podArchiveLimits(v.SizeBytes))
			if chkErr != nil {
				// The archive is refused: its writer's next write fails, which ends the
				// capture and the upload (an archive declaring a huge sparse file is not
				// streamed to its end).
				_ = chkR.CloseWithError(chkErr)
				return
			}
			_, _ = io.Copy(io.Discard, chkR) // trailing bytes: never block the upload
		}()
	} else {
		close(checked)
	}
	go func() {
		defer close(written)
		stats, archErr = c.WriteArchive(ctx, dst)
		if archErr == nil {
			_ = pw.Close()
		} else {
			_ = pw.CloseWithError(archErr)
		}
		if chkW != nil {
			_ = chkW.CloseWithError(archErr) // nil: EOF
		}
	}()
	info, putErr := r.cfg.Blobs.Put(ctx, key, pr, -1)
	_ = pr.CloseWithError(errors.New("upload ended"))
	<-written
	<-checked
	if check && archErr == nil && chkErr == nil {
		stats = chkStats
	}
	// A refused check ends the capture with its error (chkErr is then also archErr's).
	refused := check && chkErr != nil && (archErr == nil || errors.Is(archErr, chkErr))
	switch {
	case errors.Is(archErr, errSizeExceeded):
		err = fmt.Errorf("the volume's archive exceeds %d bytes", limit)
	case refused && errors.Is(chkErr, fsarchive.ErrTooLarge):
		err = fmt.Errorf("the volume's files hold more than its %d bytes: they would not fit the next copy: %w", v.SizeBytes, chkErr)
	case refused:
		err = fmt.Errorf("the archive made in the sandbox is not valid: %w", chkErr)
	case archErr != nil:
		err = fmt.Errorf("archive: %w", archErr)
	case check && chkErr != nil:
		err = fmt.Errorf("the archive made in the sandbox is not valid: %w", chkErr)
	case putErr != nil:
		err = fmt.Errorf("upload: %w", putErr)
	case info.Size != cw.n:
		err = fmt.Errorf("upload: stored %d bytes of %d", info.Size, cw.n)
	case v.SizeBytes > 0 && stats.Bytes > v.SizeBytes:
		// Sparse files: a copy may hold more than fits its volume when unpacked.
		err = fmt.Errorf("the volume's files hold %d bytes, more than its %d: they would not fit the next copy", stats.Bytes, v.SizeBytes)
	}
	if err != nil {
		_ = r.cfg.Blobs.Delete(context.WithoutCancel(ctx), key)
		return GlobalManifest{}, err
	}
	m := GlobalManifest{Generation: g.CommitGeneration, BlobKey: key, Digest: hex.EncodeToString(cw.h.Sum(nil)), SizeBytes: cw.n,
		ContentBytes: stats.Bytes, Files: stats.Files, SandboxID: id, CommitTime: time.Now().UTC()}
	if err := checkGlobalBase(ctx, r.cfg.Blobs, g); err != nil {
		_ = r.cfg.Blobs.Delete(context.WithoutCancel(ctx), key)
		return GlobalManifest{}, err
	}
	if err := WriteGlobalManifest(ctx, r.cfg.Blobs, g.BlobPrefix, m); err != nil {
		_ = r.cfg.Blobs.Delete(context.WithoutCancel(ctx), key)
		return GlobalManifest{}, fmt.Errorf("commit: %w", err)
	}
	if err := pruneGlobalGenerations(ctx, r.cfg.Blobs, g.BlobPrefix, m.Generation); err != nil {
		r.log.Warn("delete a GLOBAL volume's old generations", "sandbox", id, "volume", v.Name, "err", err)
	}
	return m, nil
}

// checkGlobalBase says whether g's volume still has the generation g's copy started from
// (CommitGeneration-1) committed.
func checkGlobalBase(ctx context.Context, st blob.Store, g *runtime.GlobalVolume) error {
	m, err := ReadGlobalManifest(ctx, st, g.BlobPrefix)
	switch {
	case errors.Is(err, blob.ErrNotFound):
		return errors.New("the volume was deleted meanwhile")
	case err != nil:
		return err
	case m.Generation != g.CommitGeneration-1:
		return fmt.Errorf("the volume is at generation %d, not %d this copy started from: another writer committed meanwhile", m.Generation, g.CommitGeneration-1)
	}
	return nil
}

// podArchiveLimits are the limits a Pod-made GLOBAL archive is checked within before it
// is committed: those its restores extract it within (snapjobs.go: the entries
// maxRestoreFiles, the files' bytes the volume's size), so that a committed generation
// is one every later restore can extract.
func podArchiveLimits(sizeBytes int64) runtime.ArchiveLimits {
	return runtime.ArchiveLimits{MaxBytes: max(sizeBytes, 0), MaxFiles: maxRestoreFiles}
}
