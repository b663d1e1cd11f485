package fsarchive

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// WriteFiles makes an archive Extract takes back file for file, the same bytes for the
// same files, and refuses a name that is not one path component.
func TestWriteFiles(t *testing.T) {
	files := map[string][]byte{"Dockerfile": []byte("FROM x\nRUN true\n"), "b": nil, "a": []byte("1")}
	var one, two bytes.Buffer
	if err := WriteFiles(&one, files); err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(&two, files); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one.Bytes(), two.Bytes()) {
		t.Error("the same files gave different archives")
	}
	root := t.TempDir()
	if _, err := Extract(context.Background(), bytes.NewReader(one.Bytes()), openDir(t, root), runtime.ArchiveLimits{}, IDMap{}); err != nil {
		t.Fatal(err)
	}
	for n, want := range files {
		got, err := os.ReadFile(filepath.Join(root, n))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %q, %v; want %q", n, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "/x", "x\x00"} {
		if err := WriteFiles(&bytes.Buffer{}, map[string][]byte{bad: nil}); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v, want ErrInvalid", bad, err)
		}
	}
}
