package image_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestWriteArchive: the docker-archive of a registry image holds that image (same
// config and layers, by digest) tagged as asked, with the registry's credentials; a bound
// below its size refuses it, and a registry the guard refuses is never dialled.
func TestWriteArchive(t *testing.T) {
	ctx := context.Background()
	good := image.Credentials{Username: "alice", Password: "s3cret"}
	host := startRegistry(t, testimage.RegistryOptions{BasicAuth: &good})
	src := smallImage(t, "a")
	if _, err := testimage.PushAuth(host, "x/app:a", src, &good); err != nil {
		t.Fatal(err)
	}
	ref := host + "/x/app:a"
	s := openStore(t, image.Options{})

	var buf bytes.Buffer
	if err := s.WriteArchive(ctx, ref, nil, &buf, 1<<20); !errors.Is(err, image.ErrUnauthorized) {
		t.Fatalf("anonymous: %v, want ErrUnauthorized", err)
	}
	buf.Reset()
	if err := s.WriteArchive(ctx, ref, &good, &buf, 1<<20); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "a.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(ref)
	got, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("the archive has no image tagged %s: %v", ref, err)
	}
	for _, f := range []func(*testing.T) (string, string){
		func(t *testing.T) (string, string) {
			a, _ := src.ConfigName()
			b, err := got.ConfigName()
			if err != nil {
				t.Fatal(err)
			}
			return a.String(), b.String()
		},
		func(t *testing.T) (string, string) {
			a, _ := src.Layers()
			b, err := got.Layers()
			if err != nil || len(a) != len(b) {
				t.Fatalf("%d layers (%v), want %d", len(b), err, len(a))
			}
			var sa, sb string
			for i := range a {
				da, _ := a[i].DiffID()
				db, err := b[i].DiffID()
				if err != nil {
					t.Fatal(err)
				}
				sa, sb = sa+da.String(), sb+db.String()
			}
			return sa, sb
		},
	} {
		if want, have := f(t); want != have {
			t.Errorf("archive differs from the pushed image: %s, want %s", have, want)
		}
	}

	if err := s.WriteArchive(ctx, ref, &good, &bytes.Buffer{}, 100); !errors.Is(err, image.ErrArchiveTooLarge) {
		t.Errorf("bound of 100 bytes: %v, want ErrArchiveTooLarge", err)
	}

	addr, accepted := listener(t)
	strict := openStore(t, image.Options{Insecure: []string{"registry.configured.test:*"}})
	if err := strict.WriteArchive(ctx, addr+"/x/app:a", nil, &bytes.Buffer{}, 1<<20); !errors.Is(err, image.ErrRegistryNotAllowed) {
		t.Errorf("unconfigured loopback registry: %v, want ErrRegistryNotAllowed", err)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections reached a refused registry", n)
	}
}
