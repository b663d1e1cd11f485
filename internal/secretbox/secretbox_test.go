package secretbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSealOpen(t *testing.T) {
	k1 := NewKey()
	r, err := New(k1)
	if err != nil {
		t.Fatal(err)
	}
	ad := AD("acme", "prod", "db/main", "password")
	id, sealed := r.Seal([]byte("hunter2"), ad)
	if id != k1.ID || bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatalf("seal: id %q, sealed %q", id, sealed)
	}
	if got, err := r.Open(id, sealed, ad); err != nil || string(got) != "hunter2" {
		t.Fatalf("open = %q, %v", got, err)
	}
	// The associated data binds the row: another org, store, path or field does not open.
	for _, other := range [][]byte{AD("globex", "prod", "db/main", "password"), AD("acme", "dev", "db/main", "password"),
		AD("acme", "prod", "db/other", "password"), AD("acme", "prod", "db/main", "user"), AD("acme", "prod", "db/main\x00", "password")} {
		if _, err := r.Open(id, sealed, other); err == nil {
			t.Fatalf("opened with ad %q", other)
		}
	}
	// Tampering fails.
	bad := append([]byte(nil), sealed...)
	bad[len(bad)-1] ^= 1
	if _, err := r.Open(id, bad, ad); err == nil {
		t.Fatal("tampered ciphertext opened")
	}
	if _, err := r.Open(id, sealed[:5], ad); err == nil {
		t.Fatal("short ciphertext opened")
	}
	// Rotation: a ring with a new current key still opens the old ciphertext.
	k2 := NewKey()
	r2, err := New(k1, k2)
	if err != nil || r2.CurrentID() != k2.ID {
		t.Fatalf("ring: %v %s", err, r2.CurrentID())
	}
	if got, err := r2.Open(id, sealed, ad); err != nil || string(got) != "hunter2" {
		t.Fatalf("rotated open = %q, %v", got, err)
	}
	if id2, _ := r2.Seal([]byte("x"), ad); id2 != k2.ID {
		t.Fatalf("rotated seal with %s", id2)
	}
	// A ring without the sealing key says so.
	r3, _ := New(k2)
	if _, err := r3.Open(id, sealed, ad); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
}

func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", DefaultFile)
	r, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", st.Mode(), err)
	}
	r2, err := LoadOrCreate(path) // the same key again
	if err != nil || r2.CurrentID() != r.CurrentID() {
		t.Fatalf("reload: %v %s %s", err, r2.CurrentID(), r.CurrentID())
	}
	ad := AD("o", "s", "p", "f")
	id, sealed := r.Seal([]byte("v"), ad)
	// Rotation by appending a key line.
	k := NewKey()
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(Line(k.ID, k.Key))
	_ = f.Close()
	r3, err := Load(path)
	if err != nil || r3.CurrentID() != k.ID {
		t.Fatalf("rotated: %v", err)
	}
	if v, err := r3.Open(id, sealed, ad); err != nil || string(v) != "v" {
		t.Fatalf("old value after rotation: %q %v", v, err)
	}
	// Refusals.
	for name, content := range map[string]string{
		"empty":    "# nothing\n",
		"short":    "k1 AAAA\n",
		"badb64":   "k1 !!!\n",
		"noid":     Line("", k.Key),
		"badid":    Line("a b/c", k.Key),
		"dup":      Line("k1", k.Key) + Line("k1", k.Key),
		"one-word": "k1\n",
	} {
		p := filepath.Join(dir, name)
		_ = os.WriteFile(p, []byte(content), 0o600)
		if _, err := Load(p); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	p := filepath.Join(dir, "writable")
	_ = os.WriteFile(p, []byte(Line("k1", k.Key)), 0o600)
	_ = os.Chmod(p, 0o666)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "others write") {
		t.Fatalf("world-writable key file: %v", err)
	}
}
