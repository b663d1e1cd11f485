package blob_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob"
)

func TestValidateKey(t *testing.T) {
	for _, k := range []string{"a", "a/b/c", "snap-1.tar.zst", "A_b/9", strings.Repeat("k", 200)} {
		if err := blob.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q): %v", k, err)
		}
	}
	for _, k := range []string{"", "/", "/a", "a/", "a//b", ".", "..", "../a", "a/..", "a/./b", ".a", "a b", "a\\b", "a\nb", "ü", strings.Repeat("k", 201), strings.Repeat("a/", 600) + "a"} {
		if err := blob.ValidateKey(k); !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", k, err)
		}
	}
}

// FuzzValidateKey: an accepted key is a clean relative path of the fixed charset.
func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "a//b", ".x", "a/b.c/d-e_f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		if blob.ValidateKey(k) != nil {
			return
		}
		if len(k) == 0 || len(k) > blob.MaxKeyLen || k[0] == '/' || strings.HasSuffix(k, "/") {
			t.Fatalf("accepted %q", k)
		}
		for _, c := range strings.Split(k, "/") {
			if c == "" || c == "." || c == ".." || c[0] == '.' || len(c) > blob.MaxComponentLen {
				t.Fatalf("accepted %q with component %q", k, c)
			}
		}
		for i := 0; i < len(k); i++ {
			if c := k[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-/", c) >= 0) {
				t.Fatalf("accepted %q with byte %q", k, c)
			}
		}
		if blob.ValidatePrefix(k) != nil || blob.ValidatePrefix(k+"/") != nil {
			t.Fatalf("key %q is not a valid prefix", k)
		}
	})
}
