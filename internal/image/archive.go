package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ErrArchiveTooLarge: an image's docker-archive would exceed the caller's bound.
var ErrArchiveTooLarge = errors.New("image archive exceeds its size bound")

// WriteArchive writes ref's image as a docker-archive (`docker load` input: manifest.json,
// config and the compressed layers as the registry serves them) to w, tagged ref, at
// most limit bytes (ErrArchiveTooLarge beyond). It fetches as Pull does: the same
// registry guard (checked on the reference and on every address dialed), the same
// credentials (creds nil means Options.Auth) and mirrors in order, then the registry
// itself. A mirror that fails before anything was written falls through to the next.
// Nothing is cached: the store keeps layers unpacked, not as blobs.
func (s *Store) WriteArchive(ctx context.Context, ref string, creds *Credentials, w io.Writer, limit int64) error {
	r, err := s.ParseReference(ref)
	if err != nil {
		return err
	}
	if err := s.checkRegistry(r); err != nil {
		return err
	}
	// The archive's tag: a digest reference is tagged by its repository, since `docker
	// load` keeps RepoTags only.
	var tag name.Tag
	switch t := r.(type) {
	case name.Tag:
		tag = t
	default:
		tag = r.Context().Tag("latest")
	}
	var tried []string
	for _, m := range s.mirrors[canonicalRegistry(r.Context().RegistryStr())] {
		src, err := s.mirrorRef(r, m)
		if err == nil {
			var wrote bool
			wrote, err = s.writeArchiveFrom(ctx, tag, src, s.mirrorAuth(m), m.transport, w, limit)
			if err == nil || wrote {
				return err
			}
		}
		if ctx.Err() != nil {
			return err
		}
		tried = append(tried, fmt.Sprintf("mirror %s (%v)", m.Host, err))
	}
	_, err = s.writeArchiveFrom(ctx, tag, r, s.authFor(r, creds), s.transport, w, limit)
	if err != nil && len(tried) > 0 {
		return fmt.Errorf("archive %s: tried %s, then %s: %w", r.Name(), strings.Join(tried, ", "), r.Context().RegistryStr(), err)
	}
	return err
}

// writeArchiveFrom writes src's image tagged tag to w; wrote says whether any byte went
// out (then no other source may be tried).
func (s *Store) writeArchiveFrom(ctx context.Context, tag name.Tag, src name.Reference, auth authn.Authenticator, tr http.RoundTripper, w io.Writer, limit int64) (wrote bool, err error) {
	img, err := remote.Image(src,
		remote.WithContext(ctx), remote.WithAuth(auth), remote.WithTransport(tr),
		remote.WithPlatform(s.platform), remote.WithUserAgent("sandboxd"))
	if err != nil {
		if strings.Contains(err.Error(), "no child with platform") {
			return false, fmt.Errorf("%w: %s has no %s image", ErrNotFound, src.Name(), s.opts.Platform)
		}
		return false, mapErr(src, err)
	}
	// The manifest bounds the archive before a layer is fetched (the limit writer
	// enforces it whatever the manifest says).
	m, err := img.Manifest()
	if err != nil {
		return false, mapErr(src, err)
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	if size > limit {
		return false, fmt.Errorf("%w: %s is %d bytes, the bound is %d", ErrArchiveTooLarge, src.Name(), size, limit)
	}
	lw := &limitWriter{w: w, left: limit}
	if err := tarball.Write(tag, img, lw); err != nil {
		if errors.Is(err, ErrArchiveTooLarge) {
			return lw.n > 0, fmt.Errorf("%w: %s: more than %d bytes", ErrArchiveTooLarge, src.Name(), limit)
		}
		return lw.n > 0, fmt.Errorf("archive %s: %w", src.Name(), mapErr(src, err))
	}
	return true, nil
}

type limitWriter struct {
	w       io.Writer
	left, n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, ErrArchiveTooLarge
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	l.n += int64(n)
	return n, err
}
