package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/storage"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// Keep says whether the manifest dgst of repository "<org>/<repo>" is still needed
// (a template references it). A kept image index keeps the manifests it lists.
type Keep func(org, repo string, dgst digest.Digest) bool

// GCResult counts what GC deleted.
type GCResult struct {
	Manifests int // manifests deleted (their tags removed with them)
}

// GC deletes every manifest keep does not keep (and the tags naming it), then sweeps the
// blobs no remaining manifest references (Distribution's MarkAndSweep). Pushes through
// this Registry wait while it runs; pushes through another replica sharing the storage
// are not stopped: run GC from one place, when no build pushes (Distribution's rule:
// garbage collection needs a registry that does not take writes).
func (r *Registry) GC(ctx context.Context, keep Keep) (GCResult, error) {
	if keep == nil {
		return GCResult{}, errors.New("registry gc: nil keep")
	}
	r.gcMu.Lock()
	defer r.gcMu.Unlock()
	var res GCResult
	var names []string
	enum, ok := r.ns.(distribution.RepositoryEnumerator)
	if !ok {
		return res, errors.New("registry gc: storage cannot enumerate repositories")
	}
	err := enum.Enumerate(ctx, func(name string) error {
		names = append(names, name)
		return nil
	})
	if err != nil && !isNotFound(err) {
		return res, fmt.Errorf("registry gc: list repositories: %w", err)
	}
	for _, name := range names {
		n, err := r.gcRepository(ctx, name, keep)
		res.Manifests += n
		if err != nil {
			return res, fmt.Errorf("registry gc: %s: %w", name, err)
		}
	}
	if err := storage.MarkAndSweep(ctx, r.driver, r.ns, storage.GCOpts{Quiet: true}); err != nil {
		return res, fmt.Errorf("registry gc: sweep: %w", err)
	}
	return res, nil
}

func (r *Registry) gcRepository(ctx context.Context, name string, keep Keep) (int, error) {
	named, err := reference.WithName(name)
	if err != nil {
		return 0, err
	}
	repo, err := r.ns.Repository(ctx, named)
	if err != nil {
		return 0, err
	}
	ms, err := repo.Manifests(ctx)
	if err != nil {
		return 0, err
	}
	me, ok := ms.(distribution.ManifestEnumerator)
	if !ok {
		return 0, errors.New("manifests cannot be enumerated")
	}
	var all []digest.Digest
	if err := me.Enumerate(ctx, func(d digest.Digest) error {
		all = append(all, d)
		return nil
	}); err != nil && !isNotFound(err) {
		return 0, err
	}
	org, rest, inOrg := strings.Cut(name, "/")
	kept := map[digest.Digest]bool{}
	for _, d := range all {
		if inOrg && keep(org, rest, d) {
			if err := markKept(ctx, ms, d, kept); err != nil {
				return 0, err
			}
		}
	}
	deleted := 0
	for _, d := range all {
		if kept[d] {
			continue
		}
		tags, err := repo.Tags(ctx).Lookup(ctx, v1.Descriptor{Digest: d})
		if err != nil && !isNotFound(err) {
			return deleted, err
		}
		for _, t := range tags {
			if err := repo.Tags(ctx).Untag(ctx, t); err != nil && !isNotFound(err) {
				return deleted, err
			}
		}
		if err := ms.Delete(ctx, d); err != nil && !isNotFound(err) {
			return deleted, err
		}
		deleted++
	}
	return deleted, nil
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
	return errors.As(err, &pnf) || errors.As(err, &mu) || errors.As(err, &tu)
}
