package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// secretKeyDSNs are the stores the rotation test runs on: a SQLite file, and a fresh
// PostgreSQL schema when PostgreSQL is available.
func secretKeyDSNs(t *testing.T) map[string]string {
	out := map[string]string{"sqlite": filepath.Join(t.TempDir(), "s.db")}
	if dsn := pgtest.SchemaFor(t, "secretkey"); dsn != "" {
		out["postgres"] = dsn
	}
	return out
}

// TestSecretKeyRotation: rotate adds a key and re-encrypts every value under it (both
// store backends); a gateway's ring loaded before picks the new key up from the file;
// an interrupted rotation is finished by reseal; prune removes only keys no value uses;
// a value whose key is gone is reported, never dropped.
func TestSecretKeyRotation(t *testing.T) {
	for name, dsn := range secretKeyDSNs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			path, ring := newKeyFile(t)
			first := ring.CurrentID()
			st := openKeyStore(t, dsn)
			ss := st.SecretStores()
			want := map[string]string{}
			put := func(r *secretbox.Keyring, org, p, v string) {
				t.Helper()
				var dup *store.AlreadyExistsError
				if _, err := ss.Create(ctx, store.SecretStore{Org: org, Name: "prod"}, 0); err != nil && !errors.As(err, &dup) {
					t.Fatal(err)
				}
				kid, ct := r.Seal([]byte(v), secretbox.AD(org, "prod", p, ""))
				if _, err := ss.PutSecret(ctx, store.Secret{Org: org, Store: "prod", Path: p, KeyID: kid, Ciphertext: ct}, 0); err != nil {
					t.Fatal(err)
				}
				want[org+"/"+p] = v
			}
			for i := range 5 {
				put(ring, "acme", fmt.Sprintf("db/%d", i), fmt.Sprintf("pw-%d", i))
			}
			put(ring, "globex", "api", "token")
			check := func(r *secretbox.Keyring, wantKey string) {
				t.Helper()
				for k, v := range want {
					org, p, _ := strings.Cut(k, "/")
					x, err := ss.GetSecret(ctx, org, "prod", p, "")
					if err != nil {
						t.Fatal(err)
					}
					if wantKey != "" && x.KeyID != wantKey {
						t.Fatalf("%s sealed with %s, want %s", k, x.KeyID, wantKey)
					}
					got, err := r.Open(x.KeyID, x.Ciphertext, secretbox.AD(org, "prod", p, ""))
					if err != nil || string(got) != v {
						t.Fatalf("%s = %q, %v", k, got, err)
					}
				}
			}
			var out bytes.Buffer
			if err := runSecretKey(ctx, "rotate", path, ss, &out); err != nil {
				t.Fatal(err)
			}
			after, err := secretbox.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			second := after.CurrentID()
			if second == first || len(after.IDs()) != 2 || !strings.Contains(out.String(), "resealed 6 values") {
				t.Fatalf("rotate: %s %v\n%s", second, after.IDs(), out.String())
			}
			check(after, second)
			// A gateway's ring from before the rotation reads the file again and opens
			// the values (and seals with the new key).
			time.Sleep(700 * time.Millisecond)
			check(ring, second)
			time.Sleep(1500 * time.Millisecond) // reloadEvery since the ring last looked
			if kid, _ := ring.Seal([]byte("x"), nil); kid != second {
				t.Fatalf("the old ring seals with %s, want %s", kid, second)
			}
			// Interrupted rotation: a key added, nothing resealed yet, and a value put
			// meanwhile by a gateway still on the old key: reseal finishes it.
			third, err := secretbox.AddKey(path)
			if err != nil {
				t.Fatal(err)
			}
			put(after, "acme", "late", "late-value") // sealed with `second`
			out.Reset()
			if err := runSecretKey(ctx, "reseal", path, ss, &out); err != nil {
				t.Fatal(err)
			}
			now, _ := secretbox.Load(path)
			check(now, third.ID)
			// prune: the two old keys go, the current one stays; values still open.
			out.Reset()
			if err := runSecretKey(ctx, "prune", path, ss, &out); err != nil {
				t.Fatal(err)
			}
			now, _ = secretbox.Load(path)
			if ids := now.IDs(); len(ids) != 1 || ids[0] != third.ID || !strings.Contains(out.String(), first) {
				t.Fatalf("prune: %v\n%s", ids, out.String())
			}
			check(now, third.ID)
			out.Reset()
			if err := runSecretKey(ctx, "prune", path, ss, &out); err != nil || !strings.Contains(out.String(), "no key to remove") {
				t.Fatalf("prune again: %v %s", err, out.String())
			}
			if err := secretbox.RemoveKeys(path, []string{third.ID}); err == nil {
				t.Fatal("removed the current key")
			}
			// A value sealed with a key the file lacks: reported, kept, not dropped.
			lost := secretbox.NewKey()
			lr, _ := secretbox.New(lost)
			kid, ct := lr.Seal([]byte("gone"), secretbox.AD("acme", "prod", "lost", ""))
			if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "lost", KeyID: kid, Ciphertext: ct}, 0); err != nil {
				t.Fatal(err)
			}
			out.Reset()
			err = runSecretKey(ctx, "rotate", path, ss, &out)
			if err == nil || !strings.Contains(err.Error(), "1 values do not open") || !strings.Contains(out.String(), "path lost") {
				t.Fatalf("lost key: %v\n%s", err, out.String())
			}
			out.Reset()
			if err := runSecretKey(ctx, "status", path, ss, &out); err != nil || !strings.Contains(out.String(), "NOT IN THE KEY FILE") {
				t.Fatalf("status: %v\n%s", err, out.String())
			}
			if x, err := ss.GetSecret(ctx, "acme", "prod", "lost", ""); err != nil || x.KeyID != lost.ID {
				t.Fatalf("lost value = %+v, %v", x, err)
			}
			// The file stays private.
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("key file mode %v, %v", fi.Mode(), err)
			}
		})
	}
}

// TestSecretKeyCommandFlags: the command needs an existing key file and a known verb.
func TestSecretKeyCommandFlags(t *testing.T) {
	var out bytes.Buffer
	if err := secretKeyCmd(nil, &out); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Fatalf("no verb: %v", err)
	}
	if err := secretKeyCmd([]string{"explode"}, &out); err == nil {
		t.Fatal("unknown verb accepted")
	}
	dir := t.TempDir()
	if err := secretKeyCmd([]string{"status", "--data-dir", dir}, &out); err == nil || !strings.Contains(err.Error(), "secret key file") {
		t.Fatalf("missing key file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, secretbox.DefaultFile)); err == nil {
		t.Fatal("made a key file")
	}
	if _, err := secretbox.LoadOrCreate(filepath.Join(dir, secretbox.DefaultFile)); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := secretKeyCmd([]string{"rotate", "--data-dir", dir}, &out); err != nil || !strings.Contains(out.String(), "resealed 0 values") {
		t.Fatalf("rotate on an empty store: %v %s", err, out.String())
	}
}

// raceStore is a store.SecretStores whose prune-time calls (KeyUsage, which prune read
// before, and RetireUnusedKeys) run then, once, race: a write landing between prune's
// check of the store and its rewrite of the key file.
type raceStore struct {
	store.SecretStores
	race func()
}

func (r *raceStore) KeyUsage(ctx context.Context) (map[string]int64, error) {
	out, err := r.SecretStores.KeyUsage(ctx)
	r.fire()
	return out, err
}

func (r *raceStore) RetireUnusedKeys(ctx context.Context, ids []string) ([]string, error) {
	out, err := r.SecretStores.RetireUnusedKeys(ctx, ids)
	r.fire()
	return out, err
}

func (r *raceStore) fire() {
	if f := r.race; f != nil {
		r.race = nil
		f()
	}
}

// TestSecretKeyPruneRace: a gateway whose ring is older than the key file (it still seals
// under the previous key) writes a value right after prune checked the store and before
// it rewrites the file. The write is refused (store.ErrKeyRetired) rather than left sealed
// under a key the file then lacks; written again under the current key it opens, and every
// stored value opens with the pruned file (both store backends). Deterministic: the write
// runs inside prune's call to the store.
func TestSecretKeyPruneRace(t *testing.T) {
	for name, dsn := range secretKeyDSNs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			path, ring := newKeyFile(t)
			// The stale gateway: the first key only, never reading the file again.
			stale, err := secretbox.Parse([]byte(mustRead(t, path)))
			if err != nil {
				t.Fatal(err)
			}
			first := ring.CurrentID()
			st := openKeyStore(t, dsn)
			ss := st.SecretStores()
			if _, err := ss.Create(ctx, store.SecretStore{Org: "acme", Name: "prod"}, 0); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := runSecretKey(ctx, "rotate", path, ss, &out); err != nil { // a second key, nothing to reseal
				t.Fatal(err)
			}
			var raceErr error
			rs := &raceStore{SecretStores: ss, race: func() {
				kid, ct := stale.Seal([]byte("late"), secretbox.AD("acme", "prod", "late", ""))
				if kid != first {
					t.Errorf("the stale ring sealed with %s, want %s", kid, first)
				}
				_, raceErr = ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "late", KeyID: kid, Ciphertext: ct}, 0)
			}}
			out.Reset()
			if err := runSecretKey(ctx, "prune", path, rs, &out); err != nil {
				t.Fatal(err)
			}
			if rs.race != nil {
				t.Fatal("prune never asked the store")
			}
			pruned, err := secretbox.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if ids := pruned.IDs(); len(ids) != 1 || ids[0] == first {
				t.Fatalf("prune left %v", ids)
			}
			if !errors.Is(raceErr, store.ErrKeyRetired) {
				t.Fatalf("a write under the pruned key during prune = %v, want ErrKeyRetired", raceErr)
			}
			// Under the current key it is taken, and every stored value opens.
			kid, ct := pruned.Seal([]byte("late"), secretbox.AD("acme", "prod", "late", ""))
			if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "late", KeyID: kid, Ciphertext: ct}, 0); err != nil {
				t.Fatal(err)
			}
			x, err := ss.GetSecret(ctx, "acme", "prod", "late", "")
			if err != nil {
				t.Fatal(err)
			}
			if v, err := pruned.Open(x.KeyID, x.Ciphertext, secretbox.AD("acme", "prod", "late", "")); err != nil || string(v) != "late" {
				t.Fatalf("late = %q, %v", v, err)
			}
			// A key still in use is not retired: writes under it still work.
			use, _ := ss.KeyUsage(ctx)
			if got, err := ss.RetireUnusedKeys(ctx, []string{kid}); err != nil || len(got) != 0 || use[kid] != 1 {
				t.Fatalf("retire a key in use = %v, %v (%v)", got, err, use)
			}
			if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "late", KeyID: kid, Ciphertext: ct}, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// newKeyFile makes a key file with one key in a fresh directory.
func newKeyFile(t *testing.T) (string, *secretbox.Keyring) {
	t.Helper()
	path := filepath.Join(t.TempDir(), secretbox.DefaultFile)
	ring, err := secretbox.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, ring
}

// openKeyStore opens the store at dsn until t ends.
func openKeyStore(t *testing.T, dsn string) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
