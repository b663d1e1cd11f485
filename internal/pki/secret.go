package pki

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SecretSize is the size of the secrets LoadOrCreateSecret makes.
const SecretSize = 32

// LoadOrCreateSecret reads the secret key at path, creating it (SecretSize random bytes,
// 0600, its directory 0700) when absent, so that what it signs outlives a restart and
// every process given the same file agrees. A file shorter than SecretSize is an error.
func LoadOrCreateSecret(path string) ([]byte, error) {
	k, err := os.ReadFile(path)
	switch {
	case err == nil && len(k) >= SecretSize:
		return k, nil
	case err == nil:
		return nil, fmt.Errorf("secret key %s: %d bytes, want at least %d", path, len(k), SecretSize)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("secret key: %w", err)
	}
	k = make([]byte, SecretSize)
	_, _ = rand.Read(k) // never fails (crypto/rand)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) { // another process made it first
		return LoadOrCreateSecret(path)
	}
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	_, err = f.Write(k)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return k, nil
}
