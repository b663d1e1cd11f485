package pki

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreateSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "edge-session.key")
	k1, err := LoadOrCreateSecret(path)
	if err != nil || len(k1) != SecretSize {
		t.Fatalf("create: %d bytes, %v", len(k1), err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi, err)
	}
	k2, err := LoadOrCreateSecret(path)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("reload gave another key (%v)", err)
	}
	short := filepath.Join(t.TempDir(), "short.key")
	if err := os.WriteFile(short, []byte("tiny"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateSecret(short); err == nil || !strings.Contains(err.Error(), "want at least 32") {
		t.Fatalf("short key: %v, want an error saying so", err)
	}
}
