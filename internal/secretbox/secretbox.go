// Package secretbox encrypts the values of the built-in secret stores at rest
// (docs/secrets.md): AES-256-GCM (Go's standard library) under a key ring read from a key
// file. Every ciphertext is stored with the ID of the key that sealed it, so a key file
// can gain a new key (new writes use it) while the old ones still open what they sealed;
// the associated data binds a ciphertext to its row (organization, store, path, field), so
// a ciphertext copied to another row does not open.
//
// The key file is text, one key per line, "<id> <base64 of 32 bytes>"; blank lines and
// lines starting with '#' are ignored; the last key is the current one. LoadOrCreate makes
// a file of one fresh key (mode 0600) when there is none, so a data dir has a key from the
// first start; a KMS-style setup points --secret-key-file at a file it mounts.
package secretbox

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/atomicfile"
)

// KeySize is the size of every key (AES-256).
const KeySize = 32

// maxKeyFile bounds the key file read (bytes).
const maxKeyFile = 64 << 10

// DefaultFile is the key file's name in a data dir.
const DefaultFile = "secret-store.key"

var keyID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Keyring seals with its current key and opens with any of its keys. A ring Load read
// from a file follows the file: it reads it again when it changed (checked at most every
// reloadEvery before a Seal, and before an Open that names a key the ring lacks), so
// gateways pick up a key `sandboxd secret-key rotate` added without a restart. A file
// that no longer parses leaves the ring as it was.
type Keyring struct {
	mu      sync.RWMutex
	current string
	aeads   map[string]cipher.AEAD
	ids     []string // in file order

	path    string // "" for a ring not from a file
	stamp   fileStamp
	checked time.Time
}

// reloadEvery bounds how often a file-backed ring looks at its file.
const reloadEvery = 2 * time.Second

type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{mod: fi.ModTime(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}

// Reload reads a file-backed ring's file again now when it changed (a ring made by New
// has none): after the store refused a value sealed under a key the file no longer has
// as current (store.ErrKeyRetired).
func (r *Keyring) Reload() { r.reload(0) }

// refresh reads the file again when it changed; force skips the interval (still at
// most every reloadEvery/4).
func (r *Keyring) refresh(force bool) {
	wait := reloadEvery
	if force {
		wait = reloadEvery / 4
	}
	r.reload(wait)
}

// reload reads the file again when it changed and was last looked at wait ago or more.
func (r *Keyring) reload(wait time.Duration) {
	if r.path == "" {
		return
	}
	r.mu.RLock()
	due := time.Since(r.checked) >= wait
	r.mu.RUnlock()
	if !due {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < wait {
		return
	}
	r.checked = time.Now()
	fi, err := os.Stat(r.path)
	if err != nil || stampOf(fi) == r.stamp {
		return
	}
	n, err := Load(r.path)
	if err != nil {
		return // keep what works
	}
	r.current, r.aeads, r.ids, r.stamp = n.current, n.aeads, n.ids, n.stamp
}

// IDs are the ring's key IDs, the current one last.
func (r *Keyring) IDs() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]string(nil), r.ids...)
}

// Key is one key of a ring.
type Key struct {
	ID  string
	Key []byte // KeySize bytes
}

// New returns a ring of keys; the last is the current one.
func New(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("secretbox: no key")
	}
	r := &Keyring{aeads: map[string]cipher.AEAD{}}
	for _, k := range keys {
		if !keyID.MatchString(k.ID) {
			return nil, fmt.Errorf("secretbox: key ID %q: want 1-64 of [A-Za-z0-9._-]", k.ID)
		}
		if len(k.Key) != KeySize {
			return nil, fmt.Errorf("secretbox: key %s: %d bytes, want %d", k.ID, len(k.Key), KeySize)
		}
		if _, dup := r.aeads[k.ID]; dup {
			return nil, fmt.Errorf("secretbox: key ID %s appears twice", k.ID)
		}
		b, err := aes.NewCipher(k.Key)
		if err != nil {
			return nil, err
		}
		a, err := cipher.NewGCM(b)
		if err != nil {
			return nil, err
		}
		r.aeads[k.ID] = a
		r.current = k.ID
		r.ids = append(r.ids, k.ID)
	}
	return r, nil
}

// CurrentID is the ID of the key new values are sealed with.
func (r *Keyring) CurrentID() string {
	r.refresh(false)
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.current
}

// AD is the associated data of a secret's value: its row.
func AD(org, store, path, field string) []byte {
	return []byte("sandboxd-secret/v1\x00" + org + "\x00" + store + "\x00" + path + "\x00" + field)
}

// Seal encrypts plain with the current key: the key's ID and nonce || ciphertext.
func (r *Keyring) Seal(plain, ad []byte) (string, []byte) {
	r.refresh(false)
	r.mu.RLock()
	id, a := r.current, r.aeads[r.current]
	r.mu.RUnlock()
	nonce := make([]byte, a.NonceSize())
	_, _ = rand.Read(nonce) // never fails (crypto/rand)
	return id, a.Seal(nonce, nonce, plain, ad)
}

// ErrUnknownKey: the ciphertext was sealed with a key the ring does not hold.
var ErrUnknownKey = errors.New("secretbox: sealed with a key this key file does not hold")

// Open decrypts what Seal made with key id for ad.
func (r *Keyring) Open(id string, sealed, ad []byte) ([]byte, error) {
	r.mu.RLock()
	a, ok := r.aeads[id]
	r.mu.RUnlock()
	if !ok {
		r.refresh(true) // a key another process added since
		r.mu.RLock()
		a, ok = r.aeads[id]
		r.mu.RUnlock()
	}
	if !ok {
		return nil, fmt.Errorf("%w (key ID %q)", ErrUnknownKey, id)
	}
	n := a.NonceSize()
	if len(sealed) < n+a.Overhead() {
		return nil, errors.New("secretbox: ciphertext too short")
	}
	plain, err := a.Open(nil, sealed[:n], sealed[n:], ad)
	if err != nil {
		return nil, errors.New("secretbox: the value does not open (another key, or moved from another row)")
	}
	return plain, nil
}

// Parse reads a key file's content.
func Parse(b []byte) (*Keyring, error) {
	var keys []Key
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, enc, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("secretbox: key file line %d: want \"<id> <base64 key>\"", n)
		}
		k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if err != nil {
			return nil, fmt.Errorf("secretbox: key file line %d: %w", n, err)
		}
		keys = append(keys, Key{ID: id, Key: k})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return New(keys...)
}

// Line is a key file line for key k (of id).
func Line(id string, k []byte) string {
	return id + " " + base64.StdEncoding.EncodeToString(k) + "\n"
}

// NewKey makes a fresh key and an ID derived from it (not revealing it).
func NewKey() Key {
	k := make([]byte, KeySize)
	_, _ = rand.Read(k)
	h := sha256.Sum256(append([]byte("sandboxd-secret-key-id\x00"), k...))
	return Key{ID: "k" + hex.EncodeToString(h[:6]), Key: k}
}

// Load reads the key file at path. A file others may write is refused.
func Load(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("secret key file %s: not a regular file", path)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("secret key file %s: mode %v lets others write it", path, st.Mode().Perm())
	}
	if st.Size() > maxKeyFile {
		return nil, fmt.Errorf("secret key file %s: %d bytes, at most %d", path, st.Size(), maxKeyFile)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	r, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.path, r.stamp, r.checked = path, stampOf(st), time.Now()
	return r, nil
}

// LoadOrCreate is Load, making the file with one fresh key (mode 0600, its directory
// 0700) when it does not exist.
func LoadOrCreate(path string) (*Keyring, error) {
	r, err := Load(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return r, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	k := NewKey()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) { // another process made it first
		return Load(path)
	}
	if err != nil {
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	_, err = f.WriteString("# sandboxd secret store key ring: \"<id> <base64 AES-256 key>\"; the last line seals new values.\n" + Line(k.ID, k.Key))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("secret key file: %w", err)
	}
	return Load(path)
}

// AddKey appends a fresh key to the key file at path (which must exist and load), making
// it the current one, and returns it. The file is replaced atomically (a copy written
// 0600 beside it, synced, renamed over it): an interrupted AddKey leaves the file as it
// was or with the key added, never torn. Comments and older keys are kept.
func AddKey(path string) (Key, error) {
	if _, err := Load(path); err != nil {
		return Key{}, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Key{}, fmt.Errorf("secret key file: %w", err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	k := NewKey()
	b = append(b, Line(k.ID, k.Key)...)
	if _, err := Parse(b); err != nil {
		return Key{}, err
	}
	return k, replaceFile(path, b)
}

// RemoveKeys rewrites the key file at path without the keys of ids (their lines only);
// the current (last) key is never removed, nor a key ID the file does not hold.
func RemoveKeys(path string, ids []string) error {
	r, err := Load(path)
	if err != nil {
		return err
	}
	drop := map[string]bool{}
	for _, id := range ids {
		if id == r.CurrentID() {
			return fmt.Errorf("secretbox: key %s is the current key: it is never removed", id)
		}
		if _, ok := r.aeads[id]; !ok {
			return fmt.Errorf("secretbox: key %s is not in %s", id, path)
		}
		drop[id] = true
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("secret key file: %w", err)
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(b), "\n") {
		id, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if drop[id] && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		out.WriteString(line)
	}
	if _, err := Parse(out.Bytes()); err != nil {
		return err
	}
	return replaceFile(path, out.Bytes())
}

// replaceFile writes b over path atomically, mode 0600.
func replaceFile(path string, b []byte) error {
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("secret key file: %w", err)
	}
	return nil
}
