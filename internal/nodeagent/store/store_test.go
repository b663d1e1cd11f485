package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func open(t *testing.T, edit func(*Config)) (*Store, Config) {
	t.Helper()
	d := t.TempDir()
	cfg := Config{Root: filepath.Join(d, "root"), StateDir: filepath.Join(d, "state"), Owner: "runner-a",
		QuotaBytes: 1000, MinFreeBytes: 100, Dirs: PlainDirs{},
		Free: func(string) (int64, error) { return 10000, nil }}
	if err := os.Mkdir(cfg.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&cfg)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, cfg
}

// reopen closes s and opens its state directory again.
func reopen(t *testing.T, s *Store, cfg Config) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	return s2
}

// checkpoint makes a complete image of size bytes for owner.
func checkpoint(t *testing.T, s *Store, owner string, size int) Entry {
	t.Helper()
	id, dir, err := s.Begin(Entry{Owner: owner, SandboxID: "sbx"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := s.Complete(id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestIDs(t *testing.T) {
	a, b := NewID("runner-a"), NewID("runner-a")
	if a == b || len(a) != 31 || ValidID(a) != nil || !strings.HasPrefix(a, "c-"+OwnerHash("runner-a")+"-") {
		t.Fatalf("%s %s", a, b)
	}
	if OwnerHash("runner-a") == OwnerHash("runner-b") {
		t.Fatal("same hash")
	}
	for _, bad := range []string{"", "..", "../c-00000000-00000000000000000000", "c-0000000-00000000000000000000", "C-00000000-00000000000000000000", "c-00000000-00000000000000000000/x", "e2e-1", "c-00000000-00000000000000000000\n"} {
		if ValidID(bad) == nil {
			t.Errorf("%q valid", bad)
		}
	}
}

func TestIndexBeforeImage(t *testing.T) {
	s, cfg := open(t, nil)
	id, dir, err := s.Begin(Entry{Owner: "runner-a", SandboxID: "sbx", Pod: PodRef{"ns", "p", "u"}}, 50)
	if err != nil {
		t.Fatal(err)
	}
	// Written before: an incomplete entry with the estimate reserved.
	if e, err := s.readEntry(id); err != nil || e.Complete || e.Bytes != 50 || e.Owner != "runner-a" {
		t.Fatalf("entry %+v", e)
	}
	if mine := s.Usage(); mine != 50 {
		t.Fatalf("reserved %d", mine)
	}
	if len(s.List("runner-a")) != 0 {
		t.Fatal("incomplete listed")
	}
	if err := os.WriteFile(filepath.Join(dir, "img"), make([]byte, 123), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := s.Complete(id)
	if err != nil || !e.Complete || e.Bytes != 123 {
		t.Fatalf("%+v %v", e, err)
	}
	s3 := reopen(t, s, cfg)
	if got := s3.List("runner-a"); len(got) != 1 || got[0].ID != id || got[0].Bytes != 123 || got[0].Pod.UID != "u" {
		t.Fatalf("reloaded %+v", got)
	}
	if fi, err := os.Stat(filepath.Join(cfg.StateDir, "index", id+".json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("index file %v %v", fi, err)
	}
}

func TestOwners(t *testing.T) {
	s, _ := open(t, nil)
	a := checkpoint(t, s, "runner-a", 10)
	if _, _, err := s.Begin(Entry{Owner: "runner-b"}, 10); err == nil {
		t.Fatal("runner-a's store made an image of runner-b")
	}
	if l := s.List("runner-b"); len(l) != 0 {
		t.Fatalf("b lists %+v", l)
	}
	if _, err := s.Get("runner-b", a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b gets a's: %v", err)
	}
	if err := s.Delete("runner-b", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("runner-a", a.ID); err != nil {
		t.Fatalf("b deleted a's: %v", err)
	}
	if err := s.Delete("runner-a", a.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("runner-a", a.ID); err != nil { // idempotent
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(s.cfg.Root, a.ID)); !os.IsNotExist(err) {
		t.Fatalf("image left: %v", err)
	}
	if err := s.Delete("runner-a", "../x"); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

func TestQuota(t *testing.T) {
	s, _ := open(t, nil)
	// Before: the estimate counts against the agent's quota (1000).
	if _, _, err := s.Begin(Entry{Owner: "runner-a"}, 1001); !errors.Is(err, ErrQuota) {
		t.Fatalf("over quota: %v", err)
	}
	checkpoint(t, s, "runner-a", 500)
	checkpoint(t, s, "runner-a", 450)
	if _, _, err := s.Begin(Entry{Owner: "runner-a"}, 51); !errors.Is(err, ErrQuota) {
		t.Fatalf("over quota with use: %v", err)
	}
	// After: a fork image larger than its estimate past the quota is deleted.
	id, dir, err := s.Begin(Entry{Owner: "runner-a", LeaveRunning: true}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "img"), make([]byte, 200), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(id); !errors.Is(err, ErrQuota) {
		t.Fatalf("after: %v", err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatal("image over quota kept")
	}
	if total := s.Usage(); total != 950 {
		t.Fatalf("usage %d", total)
	}
	// A pause image over the quota is all that is left of its sandbox: kept, flagged.
	id, dir, err = s.Begin(Entry{Owner: "runner-a"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "img"), make([]byte, 200), 0o600); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Complete(id); err != nil || !e.Complete || !e.OverQuota || e.Bytes != 200 {
		t.Fatalf("pause over quota: %+v %v", e, err)
	}
	if _, err := os.Lstat(dir); err != nil {
		t.Fatal("pause image removed")
	}
	// Free space.
	s2, _ := open(t, func(c *Config) { c.Free = func(string) (int64, error) { return 150, nil } })
	if _, _, err := s2.Begin(Entry{Owner: "runner-a"}, 51); !errors.Is(err, ErrQuota) {
		t.Fatalf("min free: %v", err)
	}
	if _, _, err := s2.Begin(Entry{Owner: "runner-a"}, 50); err != nil {
		t.Fatalf("fits: %v", err)
	}
	// The one in flight reserved its 50 against the free space: another does not fit.
	if _, _, err := s2.Begin(Entry{Owner: "runner-a"}, 1); !errors.Is(err, ErrQuota) {
		t.Fatalf("in-flight reservation ignored: %v", err)
	}
}

// failMark fails MarkComplete.
type failMark struct{ PlainDirs }

func (failMark) MarkComplete(string) error { return errors.New("disk on fire") }

func TestCompleteKeepsPauseImages(t *testing.T) {
	s, _ := open(t, func(c *Config) { c.Dirs = failMark{} })
	// A pause image that cannot be marked: kept, the error says so.
	id, dir, err := s.Begin(Entry{Owner: "runner-a"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(id); !errors.Is(err, ErrNotMarked) {
		t.Fatalf("pause: %v", err)
	}
	if _, err := os.Lstat(dir); err != nil {
		t.Fatal("pause image removed")
	}
	// A fork image that cannot be marked: removed.
	id, dir, err = s.Begin(Entry{Owner: "runner-a", LeaveRunning: true}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(id); err == nil || errors.Is(err, ErrNotMarked) {
		t.Fatalf("fork: %v", err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatal("fork image kept")
	}
}

// TestSharedStateDir: two agents never share a state directory, and one never loads or
// collects another owner's entries.
func TestSharedStateDir(t *testing.T) {
	s, cfg := open(t, func(c *Config) { c.GCAge = time.Nanosecond })
	a := checkpoint(t, s, "runner-a", 10)
	// A second agent on the same directory (a surge Pod, or another runner) refuses.
	for _, owner := range []string{"runner-a", "runner-b"} {
		c := cfg
		c.Owner = owner
		if s2, err := Open(c); !errors.Is(err, ErrLocked) {
			if s2 != nil {
				_ = s2.Close()
			}
			t.Fatalf("second open by %s: %v", owner, err)
		}
	}
	// Another owner opening it later skips a's entries and never collects a's image.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cb := cfg
	cb.Owner = "runner-b"
	b, err := Open(cb)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.entries) != 0 {
		t.Fatalf("b loaded %+v", b.entries)
	}
	if removed, err := b.GC(time.Now().Add(time.Hour)); err != nil || len(removed) != 0 {
		t.Fatalf("b collected %v %v", removed, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(cfg.Root, a.ID)); err != nil {
		t.Fatalf("a's image: %v", err)
	}
	// An index entry under a's hash naming another owner is skipped too.
	s = reopen(t, &Store{}, cfg)
	if err := s.writeEntry(&Entry{ID: NewID("runner-a"), Owner: "runner-b", Complete: true}); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, cfg)
	if len(s.entries) != 1 || s.entries[a.ID] == nil {
		t.Fatalf("a loaded %+v", s.entries)
	}
}

func TestGC(t *testing.T) {
	s, cfg := open(t, func(c *Config) { c.GCAge = time.Minute })
	now := time.Now()
	done := checkpoint(t, s, "runner-a", 10)
	// An incomplete entry of a crashed agent: reload so it is not in flight.
	stale, _, err := s.Begin(Entry{Owner: "runner-a", Created: now.Add(-2 * time.Minute)}, 10)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _, err := s.Begin(Entry{Owner: "runner-a"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	// Orphans: ours and old, ours and new, another runner's, not an ID.
	old := now.Add(-2 * time.Minute)
	mk := func(name string, mtime time.Time) string {
		p := filepath.Join(cfg.Root, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return name
	}
	orphanOld := mk(NewID("runner-a"), old)
	orphanNew := mk(NewID("runner-a"), now)
	foreign := mk(NewID("runner-b"), old)
	e2e := mk("e2e-123", old)
	s = reopen(t, s, cfg)
	removed, err := s.GC(now)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{stale, orphanOld}
	if len(removed) != 2 || !contains(removed, stale) || !contains(removed, orphanOld) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, keep := range []string{done.ID, fresh, orphanNew, foreign, e2e} {
		if _, err := os.Lstat(filepath.Join(cfg.Root, keep)); err != nil {
			t.Errorf("%s removed: %v", keep, err)
		}
	}
	// An entry whose image is gone goes too.
	if err := os.RemoveAll(filepath.Join(cfg.Root, done.ID)); err != nil {
		t.Fatal(err)
	}
	removed, _ = s.GC(now)
	if !contains(removed, done.ID) || len(s.List("runner-a")) != 0 {
		t.Fatalf("removed %v", removed)
	}
	// In flight: never collected.
	s2, _ := open(t, func(c *Config) { c.GCAge = time.Nanosecond })
	id, _, _ := s2.Begin(Entry{Owner: "runner-a", Created: now.Add(-time.Hour)}, 10)
	if removed, _ := s2.GC(now); contains(removed, id) {
		t.Fatal("in-flight image collected")
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestRemoveImageRefuses(t *testing.T) {
	s, cfg := open(t, nil)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Non-ID names.
	for _, bad := range []string{"", ".", "..", "../victim", "/", "e2e-x", "c-x"} {
		if err := s.RemoveImage(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("RemoveImage(%q): %v", bad, err)
		}
	}
	// A symlink named like an ID: refused, the target untouched.
	link := NewID("runner-a")
	if err := os.Symlink(victim, filepath.Join(cfg.Root, link)); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveImage(link); err == nil {
		t.Fatal("symlink removed")
	}
	// A directory holding a symlink: the link goes, its target stays.
	id := NewID("runner-a")
	if err := os.Mkdir(filepath.Join(cfg.Root, id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(cfg.Root, id, "in")); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveImage(id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
		t.Fatalf("followed a symlink: %v", err)
	}
	// RequireRoot: a directory not owned by root is refused (as a non-root user every
	// directory is; as root, a chowned one).
	s2, cfg2 := open(t, func(c *Config) { c.RequireRoot = true })
	id2 := NewID("runner-a")
	p := filepath.Join(cfg2.Root, id2)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Getuid() == 0 {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	if err := s2.RemoveImage(id2); err == nil {
		t.Fatal("non-root directory removed")
	}
}

func TestOpenRefusesLooseStateDir(t *testing.T) {
	d := t.TempDir()
	if err := os.Mkdir(filepath.Join(d, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(d, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Config{Root: d, StateDir: filepath.Join(d, "state"), Owner: "a", QuotaBytes: 1})
	if err == nil {
		t.Fatal("0755 state dir accepted")
	}
}

// TestHibernateDirsRoot runs the store with hibernate's real directory checks on a
// root-owned root (root only).
func TestHibernateDirsRoot(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (root-owned image directories)")
	}
	d, err := os.MkdirTemp("/var/tmp", "nodeagent-store-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(d, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Config{Root: root, StateDir: filepath.Join(d, "state"), Owner: "runner-a", QuotaBytes: 1 << 30, RequireRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	id, dir, err := s.Begin(Entry{Owner: "runner-a"}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := s.Complete(id)
	if err != nil || e.Bytes != 4096 {
		t.Fatalf("%+v %v", e, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sandboxd-complete")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("runner-a", id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatal("kept")
	}
}

// TestOpenQuarantinesBadEntry: one unreadable index file is moved aside; Open goes on.
func TestOpenQuarantinesBadEntry(t *testing.T) {
	s, cfg := open(t, nil)
	a := checkpoint(t, s, "runner-a", 10)
	bad := NewID("runner-a")
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "index", bad+".json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, cfg)
	if len(s.entries) != 1 || s.entries[a.ID] == nil {
		t.Fatalf("entries %+v", s.entries)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "quarantine", bad+".json")); err != nil {
		t.Fatalf("not quarantined: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "index", bad+".json")); !os.IsNotExist(err) {
		t.Fatalf("left in the index: %v", err)
	}
}

// FuzzRemoveImage: whatever the ID, ValidID accepts only c-<8 hex>-<20 hex>, and
// RemoveImage never removes anything but <root>/<valid id> (a decoy next to the root and
// one inside it survive every other ID).
func FuzzRemoveImage(f *testing.F) {
	for _, s := range []string{"..", "../decoy", "c-00000000-00000000000000000000", "c-00000000-00000000000000000000/..", "/", "keep", "c-00000000-0000000000000000000g", "./c-00000000-00000000000000000000"} {
		f.Add(s)
	}
	d := f.TempDir()
	root := filepath.Join(d, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		f.Fatal(err)
	}
	s := &Store{cfg: Config{Root: root}}
	decoys := []string{filepath.Join(d, "decoy"), filepath.Join(root, "keep")}
	f.Fuzz(func(t *testing.T, id string) {
		for _, p := range decoys {
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		valid := ValidID(id) == nil
		if valid != idPattern.MatchString(id) || (valid && (len(id) != 31 || strings.ContainsAny(id, "/.\x00\\"))) {
			t.Fatalf("ValidID(%q) = %v", id, valid)
		}
		target := filepath.Join(root, id)
		if valid {
			if err := os.MkdirAll(target, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		err := s.RemoveImage(id)
		if !valid && err == nil {
			t.Fatalf("RemoveImage(%q) accepted", id)
		}
		for _, p := range decoys {
			if _, serr := os.Stat(p); serr != nil {
				t.Fatalf("RemoveImage(%q) removed %s", id, p)
			}
		}
		if valid {
			if _, serr := os.Lstat(target); err != nil || !os.IsNotExist(serr) {
				t.Fatalf("RemoveImage(%q): %v, left %v", id, err, serr)
			}
		}
	})
}
