package dir_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobtest"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
)

func TestConformance(t *testing.T) {
	var root string
	blobtest.Run(t, func(t *testing.T) blob.Store {
		root = t.TempDir()
		s, err := dir.Open(root)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, blobtest.Options{Tamper: func(t *testing.T, key string) {
		p := filepath.Join(root, "objects", "t.d", "obj.o")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-1] ^= 1
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}})
}

// TestSymlinksNotFollowed: a symlink planted under the root (a directory or an object)
// is refused, not followed out of the root.
func TestSymlinksNotFollowed(t *testing.T) {
	ctx := context.Background()
	root, outside := t.TempDir(), t.TempDir()
	s, err := dir.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	secret := filepath.Join(outside, "secret.o")
	os.WriteFile(secret, []byte("SBXBLOB1 outside"), 0o600)
	if err := os.Symlink(outside, filepath.Join(root, "objects", "evil.d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(root, "objects", "link.o")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "evil/secret"); err == nil {
		t.Error("Get through a symlinked directory succeeded")
	}
	if _, err := s.Get(ctx, "link"); err == nil {
		t.Error("Get of a symlinked object succeeded")
	}
	if _, err := s.Put(ctx, "evil/new", strings.NewReader("x"), 1); err == nil {
		t.Error("Put through a symlinked directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(outside, "new.o")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Put wrote outside the root: %v", err)
	}
	if err := s.Delete(ctx, "evil/secret"); err == nil {
		t.Error("Delete through a symlinked directory succeeded")
	}
	if _, err := os.Stat(secret); err != nil {
		t.Errorf("the outside file is gone: %v", err)
	}
	for info, err := range s.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		t.Errorf("List yielded %+v through a symlink", info)
	}
}

// TestTmpClean: a failed Put leaves no temp file, and Open removes a crashed Put's.
func TestTmpClean(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, err := dir.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "k", strings.NewReader("abc"), 5); !errors.Is(err, blob.ErrSizeMismatch) {
		t.Fatalf("Put: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "tmp")); len(ents) != 0 {
		t.Errorf("tmp/ after a failed Put: %v", ents)
	}
	s.Close()
	if err := os.WriteFile(filepath.Join(root, "tmp", "crashed.tmp"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = dir.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ents, _ := os.ReadDir(filepath.Join(root, "tmp")); len(ents) != 0 {
		t.Errorf("tmp/ after Open: %v", ents)
	}
}
