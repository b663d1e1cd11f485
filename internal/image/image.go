// Package image pulls OCI/Docker images from registries into a content-addressed
// store on local disk and unpacks their layers for use as overlayfs lower dirs.
//
// Store layout under Options.Root:
//
//	index.json                      pulled images: manifest digest -> diffIDs, config, refs
//	blobs/sha256/<hex>              raw manifests and image configs, by digest
//	layers/sha256/<diffID hex>/     unpacked layer (overlayfs whiteout format), by diffID
//	tmp/                            staging; unpacked layers are renamed into place atomically
//
// Compressed layer blobs are streamed (digest and diffID verified) and not kept.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sync/errgroup"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/progress"
)

// Credentials are registry username/password (or token as password).
type Credentials struct{ Username, Password string }

// Options configure a Store.
type Options struct {
	Root     string                 // store directory, e.g. <data>/images
	Insecure []string               // registry hosts (path.Match patterns such as "localhost:*") allowed to use plain HTTP
	Auth     map[string]Credentials // registry host -> credentials
	Platform string                 // default "linux/amd64"
	// GCGrace spares images a Pull returned less than this long ago from GC, since the
	// caller may not report them in use yet (a sandbox being created). Default 0.
	GCGrace time.Duration
	// Transport, if set, is the base HTTP transport (tests). The plain-HTTP guard is always applied on top.
	Transport http.RoundTripper
	// Mirrors maps a registry host as users write it ("docker.io" also covers
	// index.docker.io and registry-1.docker.io) to mirrors tried in order, with the same
	// repository path, before that registry. Images are cached and tagged under the
	// original reference; a mirror gets only Auth[mirror host], never the upstream's credentials.
	Mirrors map[string][]Mirror
	// Forbidden reports addresses never dialled for a registry the operator did not
	// configure (in Insecure, Auth or Mirrors), checked on the reference before any dial
	// and on every address a registry name resolves to: the caller passes the sandbox
	// network. Loopback, link-local (cloud metadata), unspecified and multicast are
	// always forbidden; nil adds the host's own addresses.
	Forbidden func(netip.Addr) bool
	// LookupIP resolves registry names for the dial guard (nil: net.DefaultResolver).
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Config is the part of the OCI image config a sandbox needs.
type Config struct {
	Entrypoint, Cmd, Env []string
	WorkingDir, User     string
}

// Image is a pulled, unpacked image.
type Image struct {
	Ref    string   // normalized reference as given
	Digest string   // image manifest digest "sha256:..." (the platform manifest when pulled through an index)
	Layers []string // absolute directories of unpacked layers, BOTTOM first
	Config Config
}

var (
	ErrNotFound         = fmt.Errorf("image %w", errdefs.ErrNotFound)
	ErrUnauthorized     = errors.New("registry authorization failed")
	ErrUnreachable      = errors.New("registry unreachable")
	ErrInvalidReference = errors.New("invalid image reference")
	// ErrUnsafeLayer: a layer tried to write outside its directory or through a symlink.
	ErrUnsafeLayer = errors.New("unsafe layer content")
)

// Argv merges the image config with a spec's command and args (Docker/Kubernetes semantics):
// command set: [command]+args; only args: entrypoint+args; neither: entrypoint+cmd.
func (c Config) Argv(command string, args []string) ([]string, error) {
	var argv []string
	switch {
	case command != "":
		argv = append([]string{command}, args...)
	case len(args) > 0:
		argv = append(slices.Clone(c.Entrypoint), args...)
	default:
		argv = append(slices.Clone(c.Entrypoint), c.Cmd...)
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("no command: the spec sets none and the image has no entrypoint or cmd")
	}
	return argv, nil
}

// Store is a content-addressed image store. Safe for concurrent use.
type Store struct {
	opts      Options
	root      string
	platform  v1.Platform
	transport http.RoundTripper
	mirrors   map[string][]mirror // canonical registry host -> mirrors
	proxies   map[string]bool     // host:port of the environment's HTTP(S) proxies

	gcMu  sync.RWMutex // Pull holds R, GC holds W
	idxMu sync.Mutex   // guards idx and index.json
	idx   *indexFile
	// used is when Pull last handed out each image (manifest digest), so GC spares
	// images a caller has pulled but not yet reported in use.
	used map[string]time.Time

	pulls  flight[*Image]
	layers flight[struct{}]

	pwMu sync.Mutex            // guards pw
	pw   map[string]*pullWatch // pull key -> who watches its progress (progress.go)
}

type indexFile struct {
	Version  int                     `json:"version"`
	Images   map[string]*imageRecord `json:"images"`   // image manifest digest -> record
	Resolved map[string]string       `json:"resolved"` // top-level digest (index or manifest) -> image manifest digest
	Tags     map[string]string       `json:"tags"`     // ref name -> top-level digest, as last resolved
}

type imageRecord struct {
	Digest       string    `json:"digest"`
	ConfigDigest string    `json:"configDigest"`
	DiffIDs      []string  `json:"diffIDs"`
	Config       Config    `json:"config"`
	Refs         []string  `json:"refs"`
	PulledAt     time.Time `json:"pulledAt"`
	// Private: pulled at least once with a caller's own credentials. A later pull of it
	// by digest is served from the cache only after the registry confirms that caller's
	// access (a HEAD request), with or without credentials of its own: another tenant
	// must not run a private image because a runner happens to hold it.
	Private bool `json:"private,omitempty"`
}

// Open opens (creating if needed) the store at opts.Root.
func Open(opts Options) (*Store, error) {
	if opts.Root == "" {
		return nil, errors.New("image store: Root is required")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	if opts.Platform == "" {
		opts.Platform = "linux/amd64"
	}
	p, err := v1.ParsePlatform(opts.Platform)
	if err != nil {
		return nil, fmt.Errorf("image store: platform %q: %w", opts.Platform, err)
	}
	for _, pat := range opts.Insecure {
		if _, err := path.Match(pat, ""); err != nil {
			return nil, fmt.Errorf("image store: insecure registry pattern %q: %w", pat, err)
		}
	}
	for _, d := range []string{"blobs/sha256", "layers/sha256", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	// Leftovers of interrupted pulls; nothing can be in flight before Open returns.
	if ents, err := os.ReadDir(filepath.Join(root, "tmp")); err == nil {
		for _, e := range ents {
			_ = os.RemoveAll(filepath.Join(root, "tmp", e.Name()))
		}
	}
	base := opts.Transport
	if base == nil {
		base = remote.DefaultTransport.(*http.Transport).Clone()
	}
	s := &Store{opts: opts, root: root, platform: *p, used: map[string]time.Time{}, proxies: proxyHosts()}
	base = s.guardedBase(base)
	s.transport = &guardTransport{base: base, insecure: s.isInsecure}
	if err := s.initMirrors(base); err != nil {
		return nil, err
	}
	if err := s.loadIndex(); err != nil {
		return nil, err
	}
	return s, nil
}

// Root returns the absolute store directory.
func (s *Store) Root() string { return s.root }

func (s *Store) isInsecure(host string) bool {
	for _, pat := range s.opts.Insecure {
		if ok, _ := path.Match(pat, host); ok {
			return true
		}
	}
	return false
}

// ParseReference normalizes ref (Docker Hub defaults apply: "busybox" is
// index.docker.io/library/busybox:latest). Errors wrap ErrInvalidReference.
func (s *Store) ParseReference(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInvalidReference, ref, err)
	}
	if s.isInsecure(r.Context().RegistryStr()) {
		r, err = name.ParseReference(ref, name.Insecure)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %w", ErrInvalidReference, ref, err)
		}
	}
	return r, nil
}

func (s *Store) authFor(r name.Reference, creds *Credentials) authn.Authenticator {
	if creds != nil {
		return &authn.Basic{Username: creds.Username, Password: creds.Password}
	}
	host := r.Context().RegistryStr()
	cands := []string{host}
	if host == name.DefaultRegistry {
		cands = append(cands, "docker.io", "registry-1.docker.io")
	}
	for _, h := range cands {
		if c, ok := s.opts.Auth[h]; ok {
			return &authn.Basic{Username: c.Username, Password: c.Password}
		}
	}
	return authn.Anonymous
}

// Pull resolves ref at its registry (or the first of its mirrors that has it) and
// makes sure the image is unpacked locally. A digest-pinned ref that is cached is
// served without any network access unless creds are given or it was ever pulled with
// credentials (imageRecord.Private; then a HEAD request checks the caller's access
// first); a tag is re-resolved with a HEAD request.
// creds nil means Options.Auth, else anonymous.
func (s *Store) Pull(ctx context.Context, ref string, creds *Credentials) (*Image, error) {
	r, err := s.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	if err := s.checkRegistry(r); err != nil {
		return nil, err
	}
	key := r.Name()
	if creds != nil {
		h := sha256.Sum256([]byte(creds.Username + "\x00" + creds.Password))
		key += "\x00" + hex.EncodeToString(h[:8])
	}
	if t := progress.From(ctx); t != nil {
		s.watchPull(key, ref, t)
		defer s.unwatchPull(key, t)
	}
	return s.pulls.do(ctx, key, func(ctx context.Context) (*Image, error) {
		ctx = context.WithValue(ctx, pullKeyCtx{}, key)
		stats := &pullStats{}
		ctx = context.WithValue(ctx, pullStatsCtx{}, stats)
		start := time.Now()
		s.gcMu.RLock()
		defer s.gcMu.RUnlock()
		img, err := s.pull(ctx, r, s.authFor(r, creds), creds != nil)
		counters.ImagePull(!stats.fetched.Load(), time.Since(start), err)
		if err == nil {
			s.idxMu.Lock()
			s.used[img.Digest] = time.Now()
			if rec := s.idx.Images[img.Digest]; rec != nil && creds != nil && !rec.Private {
				rec.Private = true
				if err := s.saveIndex(); err != nil {
					s.idxMu.Unlock()
					return nil, err
				}
			}
			s.idxMu.Unlock()
		}
		return img, err
	})
}

// Lookup returns a cached image for ref (tag as last resolved, or digest) without network access.
func (s *Store) Lookup(ref string) (*Image, error) {
	r, err := s.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	top := ""
	if d, ok := r.(name.Digest); ok {
		top = d.DigestStr()
	} else {
		s.idxMu.Lock()
		top = s.idx.Tags[r.Name()]
		s.idxMu.Unlock()
	}
	if img := s.cached(r, top); img != nil {
		return img, nil
	}
	return nil, fmt.Errorf("%w: %s is not in the local cache", ErrNotFound, r.Name())
}

// cached returns the image for a top-level digest if it and all its layers are present.
func (s *Store) cached(r name.Reference, top string) *Image {
	if top == "" {
		return nil
	}
	s.idxMu.Lock()
	rec := s.idx.Images[s.idx.Resolved[top]]
	if rec != nil {
		rec = &imageRecord{Digest: rec.Digest, DiffIDs: rec.DiffIDs, Config: rec.Config}
	}
	s.idxMu.Unlock()
	if rec == nil {
		return nil
	}
	img := &Image{Ref: r.Name(), Digest: rec.Digest, Config: rec.Config}
	for _, d := range rec.DiffIDs {
		dir, err := s.layerDir(d)
		if err != nil {
			return nil
		}
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			return nil
		}
		img.Layers = append(img.Layers, dir)
	}
	return img
}

func (s *Store) layerDir(diffID string) (string, error) {
	h, err := v1.NewHash(diffID)
	if err != nil || h.Algorithm != "sha256" {
		return "", fmt.Errorf("bad diffID %q", diffID)
	}
	return filepath.Join(s.root, "layers", "sha256", h.Hex), nil
}

func (s *Store) pull(ctx context.Context, r name.Reference, auth authn.Authenticator, explicit bool) (*Image, error) {
	if d, ok := r.(name.Digest); ok {
		if img := s.cached(r, d.DigestStr()); img != nil {
			if explicit || s.private(img.Digest) {
				// Credentials of the caller's own, or an image someone pulled with theirs
				// (a private image, e.g. an organization's in the platform registry): the
				// cache holds what another caller pulled, so this caller's access is checked
				// at the registry first.
				if _, err := remote.Head(r, remote.WithContext(ctx), remote.WithAuth(auth), remote.WithTransport(s.transport),
					remote.WithUserAgent("sandboxd")); err != nil {
					return nil, mapErr(r, err)
				}
			}
			s.noteRef(img.Digest, r.Name(), "")
			return img, nil
		}
	}
	return s.pullMirrored(ctx, r, auth)
}

// pullFrom fetches r's image from src (r itself, or r at a mirror) with auth over tr.
// The result is cached and tagged under r; network errors name src.
func (s *Store) pullFrom(ctx context.Context, r, src name.Reference, auth authn.Authenticator, tr http.RoundTripper) (*Image, error) {
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(auth),
		remote.WithTransport(tr),
		remote.WithPlatform(s.platform),
		remote.WithUserAgent("sandboxd"),
	}
	if _, ok := r.(name.Tag); ok {
		desc, err := remote.Head(src, ropts...)
		if err != nil {
			if e := mapErr(src, err); errors.Is(e, ErrUnreachable) || errors.Is(e, ErrUnauthorized) || ctx.Err() != nil {
				return nil, e
			}
			// Some registries do not answer HEAD properly; GET below gives the real answer.
		} else if img := s.cached(r, desc.Digest.String()); img != nil {
			s.noteRef(img.Digest, r.Name(), desc.Digest.String())
			return img, nil
		}
	}
	desc, err := remote.Get(src, ropts...)
	if err != nil {
		return nil, mapErr(src, err)
	}
	top := desc.Digest.String()
	if img := s.cached(r, top); img != nil { // tag moved to an image we already have
		s.noteRef(img.Digest, r.Name(), top)
		return img, nil
	}
	img, err := desc.Image()
	if err != nil {
		if desc.MediaType.IsIndex() && strings.Contains(err.Error(), "no child with platform") {
			return nil, fmt.Errorf("%w: %s has no %s image", ErrNotFound, src.Name(), s.opts.Platform)
		}
		return nil, mapErr(src, err)
	}
	mdig, err := img.Digest()
	if err != nil {
		return nil, mapErr(src, err)
	}
	rawMan, err := img.RawManifest()
	if err != nil {
		return nil, mapErr(src, err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return nil, mapErr(src, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", src.Name(), err)
	}
	cdig, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", src.Name(), err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, mapErr(src, err)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return nil, fmt.Errorf("image %s: %d layers but %d diffIDs in config", src.Name(), len(layers), len(cf.RootFS.DiffIDs))
	}
	if err := s.writeBlob(mdig, rawMan); err != nil {
		return nil, err
	}
	if err := s.writeBlob(cdig, rawCfg); err != nil {
		return nil, err
	}

	digests, sizes := make([]string, len(layers)), make([]int64, len(layers))
	for i, l := range layers {
		if d, err := l.Digest(); err == nil {
			digests[i] = d.String()
		}
		if n, err := l.Size(); err == nil {
			sizes[i] = n
		}
	}
	pp := s.beginPull(ctx, digests, sizes)
	if st, _ := ctx.Value(pullStatsCtx{}).(*pullStats); st != nil {
		st.fetched.Store(true) // not in the cache: a miss, even if every layer is
	}

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	dirs := make([]string, len(layers))
	for i, l := range layers {
		diffID := cf.RootFS.DiffIDs[i]
		dir, err := s.layerDir(diffID.String())
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", src.Name(), err)
		}
		dirs[i] = dir
		g.Go(func() error {
			_, err := s.layers.do(gctx, diffID.String(), func(ctx context.Context) (struct{}, error) {
				return struct{}{}, s.fetchLayer(ctx, l, diffID, dir, func(n int64) { pp.Add(i, n); counters.ImagePullBytes(n) })
			})
			if err != nil {
				return fmt.Errorf("layer %s: %w", diffID, mapErr(src, err))
			}
			pp.Complete(i)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("pull %s: %w", src.Name(), err)
	}

	cfg := Config{
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Env: cf.Config.Env,
		WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
	}
	rec := &imageRecord{Digest: mdig.String(), ConfigDigest: cdig.String(), Config: cfg, PulledAt: time.Now().UTC()}
	for _, d := range cf.RootFS.DiffIDs {
		rec.DiffIDs = append(rec.DiffIDs, d.String())
	}
	if err := s.addImage(rec, r.Name(), top); err != nil {
		return nil, err
	}
	return &Image{Ref: r.Name(), Digest: rec.Digest, Layers: dirs, Config: cfg}, nil
}

func (s *Store) writeBlob(h v1.Hash, data []byte) error {
	p := filepath.Join(s.root, "blobs", h.Algorithm, h.Hex)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	return writeFileAtomic(p, data)
}

func writeFileAtomic(p string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), p); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// fetchLayer downloads, verifies and unpacks one layer into dir (once), passing the
// counts of compressed bytes read to count.
func (s *Store) fetchLayer(ctx context.Context, l v1.Layer, diffID v1.Hash, dir string, count func(int64)) error {
	if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
		return nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), "layer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := unpackVerified(ctx, countingReader{r: rc, add: count}, diffID, tmp); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if fi, err2 := os.Lstat(dir); err2 == nil && fi.IsDir() {
			return nil // someone else finished it
		}
		return err
	}
	return nil
}

// --- index ---

func (s *Store) loadIndex() error {
	s.idx = &indexFile{Version: 1, Images: map[string]*imageRecord{}, Resolved: map[string]string{}, Tags: map[string]string{}}
	b, err := os.ReadFile(filepath.Join(s.root, "index.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, s.idx); err != nil {
		return fmt.Errorf("image store index %s: %w", filepath.Join(s.root, "index.json"), err)
	}
	for _, m := range []*map[string]string{&s.idx.Resolved, &s.idx.Tags} {
		if *m == nil {
			*m = map[string]string{}
		}
	}
	if s.idx.Images == nil {
		s.idx.Images = map[string]*imageRecord{}
	}
	return nil
}

// saveIndex writes index.json; idxMu must be held.
func (s *Store) saveIndex() error {
	b, err := json.MarshalIndent(s.idx, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.root, "index.json"), b)
}

// private reports whether the image of digest was ever pulled with a caller's own
// credentials (imageRecord.Private).
func (s *Store) private(digest string) bool {
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	rec := s.idx.Images[digest]
	return rec != nil && rec.Private
}

func (s *Store) addImage(rec *imageRecord, ref, top string) error {
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	if old := s.idx.Images[rec.Digest]; old != nil {
		rec.Refs = old.Refs
		rec.Private = rec.Private || old.Private
	}
	s.idx.Images[rec.Digest] = rec
	s.idx.Resolved[rec.Digest] = rec.Digest
	s.noteRefLocked(rec, ref, top)
	return s.saveIndex()
}

func (s *Store) noteRef(digest, ref, top string) {
	s.idxMu.Lock()
	defer s.idxMu.Unlock()
	rec := s.idx.Images[digest]
	if rec == nil {
		return
	}
	changed := s.noteRefLocked(rec, ref, top)
	if changed {
		_ = s.saveIndex() // best effort: the image itself is complete
	}
}

func (s *Store) noteRefLocked(rec *imageRecord, ref, top string) bool {
	changed := false
	if !slices.Contains(rec.Refs, ref) {
		rec.Refs = append(rec.Refs, ref)
		changed = true
	}
	if top != "" {
		if s.idx.Resolved[top] != rec.Digest {
			s.idx.Resolved[top] = rec.Digest
			changed = true
		}
		if !strings.Contains(ref, "@") && s.idx.Tags[ref] != top {
			s.idx.Tags[ref] = top
			changed = true
		}
	}
	return changed
}

// GC removes images whose manifest digest (or top-level index digest) is not in
// inUse, then every layer no remaining image uses. It waits for in-flight pulls.
func (s *Store) GC(ctx context.Context, inUse []string) (removedImages int, removedLayers int, err error) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	keep := map[string]bool{}
	s.idxMu.Lock()
	for _, d := range inUse {
		keep[d] = true
		if m, ok := s.idx.Resolved[d]; ok {
			keep[m] = true
		}
	}
	usedLayers := map[string]bool{}
	usedBlobs := map[string]bool{}
	for dig, rec := range s.idx.Images {
		if t, ok := s.used[dig]; ok && time.Since(t) < s.opts.GCGrace {
			keep[dig] = true
		}
		if !keep[dig] {
			delete(s.used, dig)
			delete(s.idx.Images, dig)
			removedImages++
			continue
		}
		usedBlobs[rec.Digest] = true
		usedBlobs[rec.ConfigDigest] = true
		for _, d := range rec.DiffIDs {
			usedLayers[d] = true
		}
	}
	for top, m := range s.idx.Resolved {
		if s.idx.Images[m] == nil {
			delete(s.idx.Resolved, top)
		}
	}
	for ref, top := range s.idx.Tags {
		if _, ok := s.idx.Resolved[top]; !ok {
			delete(s.idx.Tags, ref)
		}
	}
	err = s.saveIndex()
	s.idxMu.Unlock()
	if err != nil {
		return removedImages, 0, err
	}

	blobDir := filepath.Join(s.root, "blobs", "sha256")
	if ents, e := os.ReadDir(blobDir); e == nil {
		for _, ent := range ents {
			if !usedBlobs["sha256:"+ent.Name()] {
				_ = os.Remove(filepath.Join(blobDir, ent.Name()))
			}
		}
	}
	layerDir := filepath.Join(s.root, "layers", "sha256")
	ents, e := os.ReadDir(layerDir)
	if e != nil {
		return removedImages, 0, e
	}
	for _, ent := range ents {
		if ctx.Err() != nil {
			return removedImages, removedLayers, ctx.Err()
		}
		if usedLayers["sha256:"+ent.Name()] {
			continue
		}
		// Move out of the way first so a half-removed layer is never visible as present.
		p := filepath.Join(layerDir, ent.Name())
		trash := filepath.Join(s.root, "tmp", "gc-"+ent.Name())
		if err := os.Rename(p, trash); err != nil {
			return removedImages, removedLayers, err
		}
		if err := os.RemoveAll(trash); err != nil {
			return removedImages, removedLayers, err
		}
		removedLayers++
	}
	return removedImages, removedLayers, nil
}
