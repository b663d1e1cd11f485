package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "f")
	for _, s := range []string{"one", "two"} {
		if err := WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		if err != nil || string(b) != s || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%q %v %v", b, err, fi.Mode())
		}
	}
	if des, _ := os.ReadDir(d); len(des) != 1 {
		t.Fatalf("temporary files left: %v", des)
	}
	if err := WriteFile(filepath.Join(d, "missing", "f"), nil, 0o600); err == nil {
		t.Fatal("wrote into a missing directory")
	}
}
