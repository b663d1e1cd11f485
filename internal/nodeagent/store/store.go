// Package store keeps the node agent's checkpoint images and their index: who owns each
// image, of which sandbox and Pod, how big, whether it is complete. It knows nothing of
// RPCs or CRI.
//
// Layout: images are <root>/<id>/ (flat: the patched shim restores <root>/<id>), made with
// hibernate.CreateImageDir and completed with hibernate.MarkComplete; the index is
// <state>/index/<id>.json (0600). An entry is written (incomplete, with the estimated size
// reserved against the quotas) before the image directory is made and rewritten once the
// image is complete, so a crash leaves an index entry pointing at an incomplete image,
// never an unowned one; GC removes those, and image directories without an entry, once
// they are older than GCAge.
//
// IDs are made here: c-<8 hex of sha256(owner)>-<20 random hex>. One store (one state
// directory, held under an exclusive flock for the store's lifetime) serves one owner: Open
// loads only entries of that owner whose ID carries its hash, and GC's orphan sweep only
// touches directories of its own hash. Two runners' hashes may collide (32 bits); that
// only matters for the orphan sweep, which also spares directories younger than GCAge. Deletion
// re-checks that the path is <root>/<valid id>, a directory and not a symlink (Lstat), and
// never follows symlinks inside.
package store

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/atomicfile"
	"github.com/sandboxd/sandboxd/internal/ckptspace"
	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
)

// Errors callers map to codes.
var (
	ErrInvalid  = errors.New("invalid checkpoint id") // INVALID_ARGUMENT
	ErrNotFound = errors.New("no such checkpoint")    // NOT_FOUND
	ErrQuota    = errors.New("quota exceeded")        // RESOURCE_EXHAUSTED
)

var idPattern = regexp.MustCompile(`^c-[0-9a-f]{8}-[0-9a-f]{20}$`)

// ValidID reports whether id is an ID this store makes.
func ValidID(id string) error {
	if !idPattern.MatchString(id) {
		if len(id) > 80 {
			id = id[:80] + "…"
		}
		return fmt.Errorf("%w %q: want c-<8 hex>-<20 hex>", ErrInvalid, id)
	}
	return nil
}

// OwnerHash is the 8 hex digits of owner in the IDs of its checkpoints.
func OwnerHash(owner string) string {
	h := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(h[:4])
}

// NewID makes a fresh checkpoint ID for owner.
func NewID(owner string) string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "c-" + OwnerHash(owner) + "-" + hex.EncodeToString(b[:])
}

// PodRef names the Pod an image was taken of.
type PodRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// Entry is one index entry.
type Entry struct {
	ID           string    `json:"id"`
	Owner        string    `json:"owner"`
	SandboxID    string    `json:"sandbox_id"`
	Pod          PodRef    `json:"pod"`
	LeaveRunning bool      `json:"leave_running"`
	Bytes        int64     `json:"bytes"` // the estimate while incomplete, then the image's size
	Created      time.Time `json:"created"`
	Complete     bool      `json:"complete"`
	// OverQuota: a pause image kept although it took the quotas past their bound.
	OverQuota bool `json:"over_quota,omitempty"`
}

// Dirs makes and completes image directories: hibernate's (root-owned) checks in
// production; tests without root swap in plain ones.
type Dirs interface {
	Create(root, id string) (string, error)
	MarkComplete(dir string) error
}

// HibernateDirs are hibernate.CreateImageDir and hibernate.MarkComplete.
type HibernateDirs struct{}

func (HibernateDirs) Create(root, id string) (string, error) {
	return hibernate.CreateImageDir(root, id)
}
func (HibernateDirs) MarkComplete(dir string) error { return hibernate.MarkComplete(dir) }

// Config configures a Store.
type Config struct {
	// Root is the checkpoint root (the shim's sandboxd_checkpoint_root).
	Root string
	// StateDir holds the index (made 0700 when missing).
	StateDir string
	// Owner is the runner this agent serves: GC removes only unindexed directories whose
	// ID carries its hash (another runner's agent on the node owns the others).
	Owner string
	// QuotaBytes bounds this store's (its owner's) images; MinFreeBytes is what must stay
	// free on Root's file system (shared with other runners' agents).
	QuotaBytes, MinFreeBytes int64
	// GCAge is how old an orphan or incomplete image must be before GC removes it
	// (default 10 min).
	GCAge time.Duration
	// RequireRoot: removal refuses directories not owned by uid 0.
	RequireRoot bool
	// Dirs defaults to HibernateDirs.
	Dirs Dirs
	// Free reports the free bytes of Root's file system (default statfs).
	Free func(root string) (int64, error)
	// Log receives what Open skips and what Complete keeps over quota (default slog.Default).
	Log *slog.Logger
}

// Store is the index and the images.
type Store struct {
	cfg      Config
	index    string
	mu       sync.Mutex
	entries  map[string]*Entry
	inFlight map[string]bool
	lock     *os.File // the state directory, flock'd exclusively while the store is open
}

// ErrLocked: another store (agent) holds the state directory.
var ErrLocked = errors.New("store: the state directory is in use by another node agent")

const maxIndexFile = 64 << 10

// Open loads the index.
func Open(cfg Config) (*Store, error) {
	for _, p := range []string{cfg.Root, cfg.StateDir} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return nil, fmt.Errorf("store: path %q: want an absolute, clean path", p)
		}
	}
	if cfg.Owner == "" {
		return nil, errors.New("store: an owner")
	}
	if cfg.QuotaBytes <= 0 {
		return nil, errors.New("store: quota must be positive")
	}
	if cfg.GCAge <= 0 {
		cfg.GCAge = 10 * time.Minute
	}
	if cfg.Dirs == nil {
		cfg.Dirs = HibernateDirs{}
	}
	if cfg.Free == nil {
		cfg.Free = ckptspace.StatfsFree
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Store{cfg: cfg, index: filepath.Join(cfg.StateDir, "index"), entries: map[string]*Entry{}, inFlight: map[string]bool{}}
	for _, d := range []string{cfg.StateDir, s.index} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("store: %w", err)
		}
		fi, err := os.Lstat(d)
		if err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
		if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("store: %s is not a directory of mode 0700", d)
		}
	}
	lock, err := os.OpenFile(cfg.StateDir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s): one agent per runner and state directory", ErrLocked, cfg.StateDir)
		}
		return nil, fmt.Errorf("store: lock %s: %w", cfg.StateDir, err)
	}
	s.lock = lock
	des, err := os.ReadDir(s.index)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	prefix := "c-" + OwnerHash(cfg.Owner) + "-"
	for _, de := range des {
		id, ok := strings.CutSuffix(de.Name(), ".json")
		if !ok || ValidID(id) != nil || !de.Type().IsRegular() {
			continue // temp files and strangers: not ours to read
		}
		if !strings.HasPrefix(id, prefix) {
			cfg.Log.Warn("node agent store: skipping another owner's index entry", "id", id)
			continue
		}
		e, err := s.readEntry(id)
		if err != nil {
			// One bad file does not stop the agent: set aside for a human, logged.
			qerr := s.quarantine(de.Name())
			cfg.Log.Error("node agent store: unreadable index entry moved to quarantine/", "id", id, "err", err, "move_err", qerr)
			continue
		}
		if e.Owner != cfg.Owner {
			cfg.Log.Warn("node agent store: skipping another owner's index entry", "id", id, "owner", e.Owner)
			continue
		}
		s.entries[id] = e
	}
	return s, nil
}

// quarantine moves index file name to <state>/quarantine/.
func (s *Store) quarantine(name string) error {
	q := filepath.Join(s.cfg.StateDir, "quarantine")
	if err := os.Mkdir(q, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return os.Rename(filepath.Join(s.index, name), filepath.Join(q, name))
}

// Close releases the state directory's lock (another store may then open it).
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close() // closing the last descriptor drops the flock
	s.lock = nil
	return err
}

func (s *Store) readEntry(id string) (*Entry, error) {
	f, err := os.OpenFile(filepath.Join(s.index, id+".json"), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("store: index %s: %w", id, err)
	}
	defer f.Close()
	b := make([]byte, maxIndexFile+1)
	n, _ := f.Read(b)
	if n > maxIndexFile {
		return nil, fmt.Errorf("store: index %s: larger than %d bytes", id, maxIndexFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b[:n]))
	dec.DisallowUnknownFields()
	var e Entry
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("store: index %s: %w", id, err)
	}
	if e.ID != id {
		return nil, fmt.Errorf("store: index %s names %q", id, e.ID)
	}
	return &e, nil
}

func (s *Store) writeEntry(e *Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(s.index, e.ID+".json"), b, 0o600); err != nil {
		return fmt.Errorf("store: index: %w", err)
	}
	return nil
}

// Usage is the bytes this store's images take (or reserve).
func (s *Store) Usage() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usageLocked()
}

func (s *Store) usageLocked() (total int64) {
	for _, e := range s.entries {
		total += e.Bytes
	}
	return total
}

// Quota returns the configured quota and minimum free bytes.
func (s *Store) Quota() (quota, minFree int64) {
	return s.cfg.QuotaBytes, s.cfg.MinFreeBytes
}

func (s *Store) limits() ckptspace.Limits {
	return ckptspace.Limits{QuotaBytes: s.cfg.QuotaBytes, MinFreeBytes: s.cfg.MinFreeBytes}
}

// Free is the free bytes of the root's file system.
func (s *Store) Free() (int64, error) { return s.cfg.Free(s.cfg.Root) }

func (s *Store) fitsLocked(extra int64, exclude string) error {
	total := s.usageLocked()
	if e := s.entries[exclude]; e != nil {
		total -= e.Bytes
	}
	if s.limits().OverQuota(total + extra) {
		return fmt.Errorf("%w: this agent's checkpoint images would exceed its quota", ErrQuota)
	}
	return nil
}

// Begin reserves estimate bytes for a new image of owner, writes its (incomplete) index
// entry and makes its directory. The caller checkpoints into dir, then calls Complete or
// Abort.
func (s *Store) Begin(e Entry, estimate int64) (id, dir string, err error) {
	if estimate <= 0 {
		return "", "", errors.New("store: a positive estimate")
	}
	if e.Owner != s.cfg.Owner {
		return "", "", errors.New("store: an image of another owner than the store's")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Free space under the lock, less what the checkpoints in flight reserved (their images
	// are still being written: free does not show them yet).
	free, err := s.Free()
	if err != nil {
		return "", "", fmt.Errorf("store: free space: %w", err)
	}
	var reserved int64
	for id := range s.inFlight {
		if f := s.entries[id]; f != nil {
			reserved += f.Bytes
		}
	}
	switch s.limits().Admit(s.usageLocked(), reserved, free, estimate) {
	case ckptspace.UnderMinFree:
		return "", "", fmt.Errorf("%w: not enough free space on the checkpoint file system for an image of this Pod", ErrQuota)
	case ckptspace.OverQuota:
		return "", "", fmt.Errorf("%w: this agent's checkpoint images would exceed its quota", ErrQuota)
	}
	e.ID = NewID(e.Owner)
	e.Bytes = estimate
	e.Complete = false
	if e.Created.IsZero() {
		e.Created = time.Now().UTC()
	}
	if err := s.writeEntry(&e); err != nil {
		return "", "", err
	}
	dir, err = s.cfg.Dirs.Create(s.cfg.Root, e.ID)
	if err != nil {
		_ = os.Remove(filepath.Join(s.index, e.ID+".json"))
		return "", "", fmt.Errorf("store: image directory: %s", err.Error()) // a node problem, not the caller's: not ErrInvalid
	}
	s.entries[e.ID] = &e
	s.inFlight[e.ID] = true
	return e.ID, dir, nil
}

// ErrNotMarked: a pause image exists but could not be marked complete (the shim will not
// restore it; GC removes it once it is older than GCAge).
var ErrNotMarked = errors.New("store: the checkpoint image exists but could not be marked complete")

// Complete measures the image, checks the quotas again with its real size, marks it
// complete and rewrites its entry.
//
// A pause image (LeaveRunning false) is all that is left of its sandbox once the
// checkpoint succeeded: Complete never deletes it. Over the quotas it is kept and flagged
// (Entry.OverQuota, logged); when its index entry cannot be rewritten it is still complete
// in memory (logged); when MarkComplete fails the error wraps ErrNotMarked and the entry
// stays incomplete (GC ages it out). Only a fork image (LeaveRunning) over the quotas, or
// one that cannot be marked or indexed, is removed (ErrQuota or the error).
// Free space is not checked again: Begin reserved the estimate against it.
func (s *Store) Complete(id string) (Entry, error) {
	s.mu.Lock()
	e := s.entries[id]
	if e == nil || !s.inFlight[id] {
		s.mu.Unlock()
		return Entry{}, fmt.Errorf("%w %s in flight", ErrNotFound, id)
	}
	fork := e.LeaveRunning
	s.mu.Unlock()
	// Measured outside the lock (an image may hold many files); in flight, nothing else
	// touches it.
	dir := filepath.Join(s.cfg.Root, id)
	size, err := dirSize(dir)
	if err != nil && !fork {
		s.cfg.Log.Warn("node agent store: sizing a pause image; keeping its estimate", "id", id, "err", err)
		size, err = -1, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if size < 0 {
		size = e.Bytes
	}
	over := false
	if err == nil {
		if qerr := s.fitsLocked(size, id); qerr != nil {
			if fork {
				err = qerr
			} else {
				over = true
				s.cfg.Log.Warn("node agent store: a pause image is over the quota; kept (its sandbox is gone)", "id", id, "bytes", size, "err", qerr)
			}
		}
	}
	if err == nil {
		if merr := s.cfg.Dirs.MarkComplete(dir); merr != nil {
			s.cfg.Log.Error("node agent store: mark complete", "id", id, "err", merr)
			if !fork {
				delete(s.inFlight, id)
				return Entry{}, fmt.Errorf("%w (checkpoint %s)", ErrNotMarked, id)
			}
			err = errors.New("store: the checkpoint image could not be marked complete") // not hibernate.ErrInvalid: not the caller's
		}
	}
	if err == nil {
		n := *e
		n.Bytes, n.Complete, n.OverQuota = size, true, over
		if werr := s.writeEntry(&n); werr != nil {
			if fork {
				err = werr
			} else {
				s.cfg.Log.Error("node agent store: writing a pause image's index entry; complete until the agent restarts", "id", id, "err", werr)
				*e = n
			}
		} else {
			*e = n
		}
	}
	if err != nil { // a fork image only
		if rerr := s.removeLocked(id); rerr != nil {
			s.cfg.Log.Warn("node agent store: removing a fork image; GC retries", "id", id, "err", rerr)
		}
		delete(s.inFlight, id)
		return Entry{}, err
	}
	delete(s.inFlight, id)
	return *e, nil
}

// Abandon gives up an image whose checkpoint timed out while the shim may still be
// writing into it: nothing is removed now; its entry stays incomplete (not listed),
// restamped now, so GC removes it GCAge from now.
func (s *Store) Abandon(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	if e == nil || !s.inFlight[id] {
		return fmt.Errorf("%w %s in flight", ErrNotFound, id)
	}
	delete(s.inFlight, id)
	n := *e
	n.Created = time.Now().UTC()
	*e = n
	return s.writeEntry(&n)
}

// Abort removes an image that failed and its entry (when that fails, GC retries).
func (s *Store) Abort(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inFlight, id)
	return s.removeLocked(id)
}

// removeLocked removes image id (if present) and then its entry.
func (s *Store) removeLocked(id string) error {
	if err := s.RemoveImage(id); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.index, id+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: %w", err)
	}
	delete(s.entries, id)
	delete(s.inFlight, id)
	return nil
}

// RemoveImage removes <root>/<id> after checking that id is a valid ID and the path a
// directory (Lstat: a symlink is refused, never followed), owned by root when the store
// requires it. A missing directory is not an error.
func (s *Store) RemoveImage(id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	p := filepath.Join(s.cfg.Root, id)
	if filepath.Dir(p) != s.cfg.Root {
		return fmt.Errorf("%w %q", ErrInvalid, id)
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("store: image %s is not a directory (a symlink or a file): not removed", id)
	}
	if st, _ := fi.Sys().(*syscall.Stat_t); s.cfg.RequireRoot && (st == nil || st.Uid != 0) {
		return fmt.Errorf("store: image %s is not owned by root: not removed", id)
	}
	// RemoveAll removes symlinks inside, never what they point at.
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// Get returns owner's complete entry id; another owner's, or an incomplete one, is
// ErrNotFound.
func (s *Store) Get(owner, id string) (Entry, error) {
	if err := ValidID(id); err != nil {
		return Entry{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	if e == nil || e.Owner != owner || !e.Complete {
		return Entry{}, fmt.Errorf("%w %s", ErrNotFound, id)
	}
	return *e, nil
}

// List returns owner's complete entries, oldest first.
func (s *Store) List(owner string) []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Entry
	for _, e := range s.entries {
		if e.Owner == owner && e.Complete {
			out = append(out, *e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Delete deletes owner's checkpoint id. An unknown ID, or another owner's, is no error
// and deletes nothing (idempotent; another owner's looks exactly like an unknown one).
func (s *Store) Delete(owner, id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	if e == nil || e.Owner != owner || s.inFlight[id] {
		return nil
	}
	return s.removeLocked(id)
}

// GC removes incomplete entries (not in flight) older than GCAge with their images,
// entries whose image directory is gone, and image directories of this store's owner
// without an entry whose mtime is older than GCAge. It returns the IDs removed.
func (s *Store) GC(now time.Time) ([]string, error) {
	// Under the lock: pick the entries to collect and take them out of the index map (a
	// crash after that leaves an index file without an image: collected next time). The
	// removals run without the lock.
	s.mu.Lock()
	var drop []*Entry
	for id, e := range s.entries {
		if s.inFlight[id] {
			continue
		}
		_, err := os.Lstat(filepath.Join(s.cfg.Root, id))
		gone := errors.Is(err, fs.ErrNotExist)
		if gone || (!e.Complete && now.Sub(e.Created) > s.cfg.GCAge) {
			drop = append(drop, e)
			delete(s.entries, id)
		}
	}
	indexed := make(map[string]bool, len(s.entries))
	for id := range s.entries {
		indexed[id] = true
	}
	s.mu.Unlock()
	var removed []string
	var errs []error
	for _, e := range drop {
		err := s.RemoveImage(e.ID)
		if err == nil {
			if rerr := os.Remove(filepath.Join(s.index, e.ID+".json")); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = fmt.Errorf("store: %w", rerr)
			}
		}
		if err != nil {
			s.mu.Lock()
			s.entries[e.ID] = e // retried next time
			s.mu.Unlock()
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.ID)
	}
	for _, e := range drop {
		indexed[e.ID] = true // not an orphan of this pass
	}
	des, err := os.ReadDir(s.cfg.Root)
	if err != nil {
		return removed, errors.Join(append(errs, fmt.Errorf("store: %w", err))...)
	}
	// Orphans: unindexed directories of this owner's hash (the state directory's flock
	// makes this the only agent of the owner; Begin indexes before it makes a directory).
	prefix := "c-" + OwnerHash(s.cfg.Owner) + "-"
	for _, de := range des {
		id := de.Name()
		if ValidID(id) != nil || !strings.HasPrefix(id, prefix) || indexed[id] {
			continue
		}
		fi, err := os.Lstat(filepath.Join(s.cfg.Root, id))
		if err != nil || !fi.IsDir() || now.Sub(fi.ModTime()) <= s.cfg.GCAge {
			continue
		}
		s.mu.Lock()
		late := s.entries[id] != nil // indexed since (an ID is never reused, but be sure)
		s.mu.Unlock()
		if late {
			continue
		}
		if err := s.RemoveImage(id); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	slices.Sort(removed)
	return removed, errors.Join(errs...)
}

// dirSize is the bytes of the regular files under dir (not following symlinks), at most
// 1<<20 entries.
func dirSize(dir string) (int64, error) {
	var size int64
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n > 1<<20 {
			return errors.New("too many files")
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			size += fi.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: size of %s: %w", dir, err)
	}
	return size, nil
}

// PlainDirs make and complete image directories without hibernate's root-ownership
// checks: for tests and tools that run without root, never for the agent.
type PlainDirs struct{}

func (PlainDirs) Create(root, id string) (string, error) {
	d := filepath.Join(root, id)
	return d, os.Mkdir(d, 0o700)
}
func (PlainDirs) MarkComplete(dir string) error {
	return os.WriteFile(filepath.Join(dir, hibernate.CompleteMarker), nil, 0o600)
}
