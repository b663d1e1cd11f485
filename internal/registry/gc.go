package registry

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/storage"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// Keep says whether the manifest dgst of repository "<org>/<repo>", which tags name (the
// repository's tags whose current manifest it is), is still needed. A kept image index
// keeps the manifests it lists. References.Keep is one.
type Keep func(org, repo string, dgst digest.Digest, tags []string) bool

// DefaultGCGrace is GCOptions.Grace's default.
const DefaultGCGrace = time.Hour

// GCOptions configures GC.
type GCOptions struct {
	// Keep keeps manifests (nil: only young ones are kept).
	Keep Keep
	// Grace: a manifest, blob or repository layer link written less than Grace ago is
	// never deleted, whatever Keep says (0: DefaultGCGrace; at least a minute). It must
	// outlast a push (its first blob to its manifest) and what follows it (a build
	// pointing its template at the pushed digest).
	Grace time.Duration
	// OrgStorages are organizations whose own storage (Config.OrgStorage) is collected
	// too, after the platform storage: only their repositories there ("<org>/…"), with
	// the same Keep; another organization's repositories in the same bucket are kept
	// whole, and their blobs with them.
	OrgStorages []string
	// OrgTimeout bounds the pass over each organization's storage (0:
	// DefaultOrgGCTimeout): a slow or unresponsive endpoint ends its own pass, with an
	// error, not the others'.
	OrgTimeout time.Duration
}

// DefaultOrgGCTimeout is GCOptions.OrgTimeout's default.
const DefaultOrgGCTimeout = 10 * time.Minute

// GCResult counts what GC deleted.
type GCResult struct {
	Manifests int // manifests deleted (their tags removed with them)
	Blobs     int // blobs deleted from storage (layers, configs, manifests' content)
	Links     int // repository layer links deleted
}

// Storage layout (Distribution's registry/storage/paths.go, stable since v2): what GC
// reads the write time of.
const storageRoot = "/docker/registry/v2"

func linkPath(repo, kind string, d digest.Digest) string {
	return storageRoot + "/repositories/" + repo + "/" + kind + "/" + d.Algorithm().String() + "/" + d.Encoded() + "/link"
}

func blobDataPath(d digest.Digest) string {
	e := d.Encoded()
	return storageRoot + "/blobs/" + d.Algorithm().String() + "/" + e[:2] + "/" + e + "/data"
}

// GC deletes every manifest opts.Keep does not keep and that is older than the grace (and
// the tags naming it), then sweeps the blobs and repository layer links no remaining
// manifest references, again only those older than the grace.
//
// Distribution's own garbage collection needs a registry that takes no writes: a push is
// several requests (blobs, then the manifest), and a sweep between them deletes blobs
// nothing references yet. Here pushes are not stopped; two things keep them whole:
//   - the grace: a blob or link written in the last Grace, and a manifest pushed in it,
//     stays, so a push in progress (and a build about to record its digest in a
//     template) keeps all it wrote, whichever replica serves it;
//   - a lock per storage: writes through this Registry hold the storage's gcMu shared
//     for their request and the pass over that storage holds it exclusively, so no write
//     of this process to that storage runs during its pass (an organization's bucket's
//     pass holds up that organization's pushes only; two organizations sharing a bucket
//     have a lock each, and the grace covers them as it covers replicas).
//
// Each organization's storage is collected within opts.OrgTimeout.
//
// What remains: a push that skips a blob because the repository already has it (HEAD)
// while that blob's only manifest is old and unreferenced; if a pass deletes it between
// that HEAD and the manifest's PUT, the PUT fails with MANIFEST_BLOB_UNKNOWN and the push
// must be retried (no stored image is ever left incomplete). Passes on several replicas
// at once are safe (a delete of what is gone is not an error).
func (r *Registry) GC(ctx context.Context, opts GCOptions) (GCResult, error) {
	if opts.Grace == 0 {
		opts.Grace = DefaultGCGrace
	}
	opts.Grace = max(opts.Grace, time.Minute)
	if opts.OrgTimeout <= 0 {
		opts.OrgTimeout = DefaultOrgGCTimeout
	}
	res, err := r.gcStorage(ctx, r.platform, "", opts)
	if err != nil {
		return res, err
	}
	var errs []error
	for _, org := range opts.OrgStorages {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		n, err := r.gcOrg(ctx, org, opts)
		res.Manifests += n.Manifests
		res.Blobs += n.Blobs
		res.Links += n.Links
		if err != nil {
			errs = append(errs, fmt.Errorf("storage of %s: %w", org, err))
		}
	}
	return res, errors.Join(errs...)
}

// gcOrg is the pass over org's own storage, within opts.OrgTimeout.
func (r *Registry) gcOrg(ctx context.Context, org string, opts GCOptions) (GCResult, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.OrgTimeout)
	defer cancel()
	b, err := r.backendFor(ctx, org, true) // a pass deletes: never on a stale answer
	switch {
	case err != nil:
		return GCResult{}, fmt.Errorf("registry gc: %w", err)
	case b == r.platform:
		return GCResult{}, nil // back on the platform storage: collected above
	}
	return r.gcStorage(ctx, b, org, opts)
}

// gcStorage is one pass over storage b: every repository when org is "", else only
// org's (the others are kept whole).
func (r *Registry) gcStorage(ctx context.Context, b *backend, org string, opts GCOptions) (GCResult, error) {
	if err := lockForGC(ctx, &b.gcMu); err != nil {
		return GCResult{}, fmt.Errorf("registry gc: waiting for the storage's writes to end: %w", err)
	}
	defer b.gcMu.Unlock()
	g := &gcPass{r: r, b: b, only: org, ctx: ctx, cutoff: r.cfg.now().Add(-opts.Grace), keep: opts.Keep, marked: map[digest.Digest]bool{}}
	enum, ok := b.ns.(distribution.RepositoryEnumerator)
	if !ok {
		return g.res, errors.New("registry gc: storage cannot enumerate repositories")
	}
	var names []string
	err := enum.Enumerate(ctx, func(name string) error {
		names = append(names, name)
		return nil
	})
	if err != nil && !isNotFound(err) {
		return g.res, fmt.Errorf("registry gc: list repositories: %w", err)
	}
	// Delete the manifests no one keeps, marking what the others reference.
	for _, name := range names {
		if err := g.repository(name); err != nil {
			return g.res, fmt.Errorf("registry gc: %s: %w", name, err)
		}
	}
	// Another organization's repositories (a shared bucket) keep every blob they link,
	// whether a manifest references it yet or not (a repository with no manifest is not
	// even enumerated).
	if err := g.markOthers(); err != nil {
		return g.res, fmt.Errorf("registry gc: other organizations' links: %w", err)
	}
	// Sweep: layer links first (a young link keeps its blob), then the blobs.
	for _, name := range names {
		if !g.collects(name) {
			continue
		}
		if err := g.sweepLinks(name); err != nil {
			return g.res, fmt.Errorf("registry gc: %s: %w", name, err)
		}
	}
	if err := g.sweepBlobs(); err != nil {
		return g.res, fmt.Errorf("registry gc: sweep: %w", err)
	}
	return g.res, nil
}

type gcPass struct {
	r *Registry
	b *backend
	// only: when set, the pass collects only this organization's repositories.
	only   string
	ctx    context.Context
	cutoff time.Time
	keep   Keep
	// marked: every digest a remaining manifest references (itself included), or a
	// young layer link names.
	marked map[digest.Digest]bool
	res    GCResult
}

// young reports whether the object at p was written after the cutoff; a missing one is
// not young, and an error is returned as one (the caller keeps what it cannot tell).
func (g *gcPass) young(p string) (bool, error) {
	fi, err := g.b.driver.Stat(g.ctx, p)
	if err != nil {
		if isNotFound(err) {
			return false, nil
		}
		return false, err
	}
	return fi.ModTime().After(g.cutoff), nil
}

func (g *gcPass) repository(name string) error {
	named, err := reference.WithName(name)
	if err != nil {
		return err
	}
	repo, err := g.b.ns.Repository(g.ctx, named)
	if err != nil {
		return err
	}
	ms, err := repo.Manifests(g.ctx)
	if err != nil {
		return err
	}
	me, ok := ms.(distribution.ManifestEnumerator)
	if !ok {
		return errors.New("manifests cannot be enumerated")
	}
	var all []digest.Digest
	if err := me.Enumerate(g.ctx, func(d digest.Digest) error {
		all = append(all, d)
		return nil
	}); err != nil && !isNotFound(err) {
		return err
	}
	tagsOf, err := currentTags(g.ctx, repo)
	if err != nil {
		return err
	}
	org, rest, inOrg := strings.Cut(name, "/")
	kept := map[digest.Digest]bool{}
	for _, d := range all {
		young, err := g.young(linkPath(name, "_manifests/revisions", d))
		if err != nil {
			return err
		}
		if young || !g.collects(name) || (inOrg && g.keep != nil && g.keep(org, rest, d, tagsOf[d])) {
			if err := markKept(g.ctx, ms, d, kept); err != nil {
				return err
			}
		}
	}
	for _, d := range all {
		if kept[d] {
			continue
		}
		for _, t := range tagsOf[d] {
			if err := repo.Tags(g.ctx).Untag(g.ctx, t); err != nil && !isNotFound(err) {
				return err
			}
		}
		if err := ms.Delete(g.ctx, d); err != nil {
			if isNotFound(err) {
				continue // another pass was first
			}
			return err
		}
		g.res.Manifests++
	}
	// Mark what the remaining manifests reference.
	for d := range kept {
		if err := g.mark(ms, d); err != nil {
			return err
		}
	}
	return nil
}

// collects reports whether the pass may delete in repository name.
func (g *gcPass) collects(name string) bool {
	if g.only == "" {
		return true
	}
	org, _, _ := strings.Cut(name, "/")
	return org == g.only
}

// currentTags maps each manifest of repo to the tags whose current manifest it is.
func currentTags(ctx context.Context, repo distribution.Repository) (map[digest.Digest][]string, error) {
	ts := repo.Tags(ctx)
	tags, err := ts.All(ctx)
	if err != nil {
		var ru distribution.ErrRepositoryUnknown
		if isNotFound(err) || errors.As(err, &ru) {
			return nil, nil
		}
		return nil, err
	}
	out := map[digest.Digest][]string{}
	for _, t := range tags {
		desc, err := ts.Get(ctx, t)
		if err != nil {
			if isNotFound(err) {
				continue
			}
			return nil, err
		}
		out[desc.Digest] = append(out[desc.Digest], t)
	}
	return out, nil
}

// mark marks manifest d and everything it references, recursively (an index's
// manifests). A manifest that cannot be read fails the pass: sweeping without its
// references would delete blobs it needs.
func (g *gcPass) mark(ms distribution.ManifestService, d digest.Digest) error {
	if g.marked[d] {
		return nil
	}
	m, err := ms.Get(g.ctx, d)
	if err != nil {
		if isNotFound(err) {
			return nil // deleted under us (a pass on another replica): nothing to keep
		}
		return fmt.Errorf("read manifest %s: %w", d, err)
	}
	g.marked[d] = true
	for _, ref := range m.References() {
		if g.marked[ref.Digest] {
			continue
		}
		if ok, _ := ms.Exists(g.ctx, ref.Digest); ok {
			if err := g.mark(ms, ref.Digest); err != nil {
				return err
			}
			continue
		}
		g.marked[ref.Digest] = true
	}
	return nil
}

// layerLinks are the digests repository name's layer links name.
func (g *gcPass) layerLinks(name string) ([]digest.Digest, error) {
	named, err := reference.WithName(name)
	if err != nil {
		return nil, err
	}
	repo, err := g.b.ns.Repository(g.ctx, named)
	if err != nil {
		return nil, err
	}
	le, ok := repo.Blobs(g.ctx).(distribution.ManifestEnumerator)
	if !ok {
		return nil, errors.New("layer links cannot be enumerated")
	}
	var links []digest.Digest
	if err := le.Enumerate(g.ctx, func(d digest.Digest) error {
		links = append(links, d)
		return nil
	}); err != nil && !isNotFound(err) {
		return nil, err
	}
	return links, nil
}

// markOthers, in a pass that collects one organization only, marks every digest a link
// file of another organization's repositories names (layers, manifest revisions, index
// entries: the digest is in the link's path, …/<algorithm>/<hex>/link).
func (g *gcPass) markOthers() error {
	if g.only == "" {
		return nil
	}
	// Whoever holds the bucket's credentials can write any number of objects under
	// other names: the walk is bounded, and a pass that reaches the bound deletes nothing.
	walked := 0
	orgs, err := g.b.driver.List(g.ctx, storageRoot+"/repositories")
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return err
	}
	for _, dir := range orgs {
		if path.Base(dir) == g.only {
			continue
		}
		err := g.b.driver.Walk(g.ctx, dir, func(fi storagedriver.FileInfo) error {
			if walked++; walked > maxOtherLinks {
				return fmt.Errorf("more than %d objects under other organizations' repositories in this bucket: nothing collected", maxOtherLinks)
			}
			p := fi.Path()
			if fi.IsDir() || !strings.HasSuffix(p, "/link") {
				return nil
			}
			parts := strings.Split(p, "/")
			if len(parts) < 4 {
				return nil
			}
			d := digest.NewDigestFromEncoded(digest.Algorithm(parts[len(parts)-3]), parts[len(parts)-2])
			if d.Validate() == nil {
				g.marked[d] = true
			}
			return nil
		})
		if err != nil && !isNotFound(err) {
			return err
		}
	}
	return nil
}

// sweepLinks deletes repository name's layer links that are neither marked nor young.
func (g *gcPass) sweepLinks(name string) error {
	links, err := g.layerLinks(name)
	if err != nil {
		return err
	}
	vac := storage.NewVacuum(g.ctx, g.b.driver)
	for _, d := range links {
		if g.marked[d] {
			continue
		}
		young, err := g.young(linkPath(name, "_layers", d))
		if err != nil {
			return err
		}
		if young {
			g.marked[d] = true // a push in progress may still reference it
			continue
		}
		if err := vac.RemoveLayer(name, d); err != nil {
			if isNotFound(err) {
				continue
			}
			return err
		}
		g.res.Links++
	}
	return nil
}

// sweepBlobs deletes the blobs that are neither marked nor young.
func (g *gcPass) sweepBlobs() error {
	var blobs []digest.Digest
	if err := g.b.ns.Blobs().Enumerate(g.ctx, func(d digest.Digest) error {
		blobs = append(blobs, d)
		return nil
	}); err != nil && !isNotFound(err) {
		return err
	}
	vac := storage.NewVacuum(g.ctx, g.b.driver)
	for _, d := range blobs {
		if g.marked[d] || d.Validate() != nil {
			continue
		}
		young, err := g.young(blobDataPath(d))
		if err != nil {
			return err
		}
		if young {
			continue
		}
		if err := vac.RemoveBlob(d.String()); err != nil {
			if isNotFound(err) {
				continue
			}
			return err
		}
		g.res.Blobs++
	}
	return nil
}

// markKept marks d and, for an index, the manifests it lists.
func markKept(ctx context.Context, ms distribution.ManifestService, d digest.Digest, kept map[digest.Digest]bool) error {
	if kept[d] {
		return nil
	}
	kept[d] = true
	m, err := ms.Get(ctx, d)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return err
	}
	for _, ref := range m.References() {
		switch ref.MediaType {
		case v1.MediaTypeImageManifest, v1.MediaTypeImageIndex,
			"application/vnd.docker.distribution.manifest.v2+json",
			"application/vnd.docker.distribution.manifest.list.v2+json":
			if err := markKept(ctx, ms, ref.Digest, kept); err != nil {
				return err
			}
		}
	}
	return nil
}

func isNotFound(err error) bool {
	var pnf storagedriver.PathNotFoundError
	var mu distribution.ErrManifestUnknownRevision
	var tu distribution.ErrTagUnknown
	var bu = distribution.ErrBlobUnknown
	return errors.As(err, &pnf) || errors.As(err, &mu) || errors.As(err, &tu) || errors.Is(err, bu)
}

// maxOtherLinks bounds the objects markOthers walks in one pass.
const maxOtherLinks = 1 << 20

// lockForGC takes mu exclusively once no write holds it, polling until ctx ends. Unlike
// Lock it gives up with ctx, and a pass waiting for it never makes new writes queue
// behind it (a write stuck on an unresponsive endpoint stalls that pass only).
func lockForGC(ctx context.Context, mu *sync.RWMutex) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !mu.TryLock() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
