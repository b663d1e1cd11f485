package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// `sandboxd secret-key status|rotate|reseal|prune` (docs/secrets.md): rotation of the
// built-in secret stores' key ring. rotate adds a fresh key to the key file (the current
// one from then on) and re-encrypts every stored value under it (reseal); old keys stay
// in the file until prune finds no value sealed with them. Every step is safe to
// interrupt and to run again: the key file is replaced atomically, and each value is
// swapped in one compare-and-swap update (a value put meanwhile is left alone: a
// gateway sealed it under the key it holds, and a later reseal moves it).

const secretKeyUsage = `usage: sandboxd secret-key <status|rotate|reseal|prune> [--secret-key-file F | --data-dir D | --pki-dir P] [--store DSN]
  status  the key file's keys (the last seals) and how many stored values each sealed
  rotate  add a fresh key to the key file, then reseal
  reseal  re-encrypt every value not sealed with the current key under it (resumes an
          interrupted rotate)
  prune   remove the keys no stored value uses from the key file (never the current one)`

type secretKeyConfig struct {
	keyFile, dataDir, pkiDir, storeDSN string
}

func (c *secretKeyConfig) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.keyFile, "secret-key-file", "", "the key ring (default PKI-DIR/"+secretbox.DefaultFile+" with --pki-dir, else DATA-DIR/"+secretbox.DefaultFile+")")
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory (sandboxd dev's key file and store)")
	fs.StringVar(&c.pkiDir, "pki-dir", "", "the gateways' shared PKI directory (their key file)")
	fs.StringVar(&c.storeDSN, "store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
}

func (c secretKeyConfig) path() string {
	switch {
	case c.keyFile != "":
		return c.keyFile
	case c.pkiDir != "":
		return filepath.Join(c.pkiDir, secretbox.DefaultFile)
	}
	return filepath.Join(c.dataDir, secretbox.DefaultFile)
}

func secretKeyCmd(args []string, w io.Writer) error {
	if len(args) == 0 || !slices.Contains([]string{"status", "rotate", "reseal", "prune"}, args[0]) {
		return errors.New(secretKeyUsage)
	}
	var c secretKeyConfig
	fs := flag.NewFlagSet("secret-key "+args[0], flag.ContinueOnError)
	c.bind(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("secret-key %s: unexpected argument %q", args[0], fs.Arg(0))
	}
	path := c.path()
	if _, err := secretbox.Load(path); err != nil {
		return err // never made here: a missing file is the operator's mistake
	}
	ctx := context.Background()
	st, err := openStore(ctx, c.dataDir, c.storeDSN)
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	return runSecretKey(ctx, args[0], path, st.SecretStores(), w)
}

// runSecretKey runs one secret-key subcommand on the key file at path and the store ss.
func runSecretKey(ctx context.Context, cmd, path string, ss store.SecretStores, w io.Writer) error {
	switch cmd {
	case "rotate":
		k, err := secretbox.AddKey(path)
		if err != nil {
			return err
		}
		_, _ = fmt.Fprintf(w, "added key %s to %s: it seals new values from now on (gateways read the file again within seconds)\n", k.ID, path)
		fallthrough
	case "reseal":
		if err := reseal(ctx, path, ss, w); err != nil {
			return err
		}
		return keyStatus(ctx, path, ss, w)
	case "prune":
		r, err := secretbox.Load(path)
		if err != nil {
			return err
		}
		var old []string
		for _, id := range r.IDs() {
			if id != r.CurrentID() {
				old = append(old, id)
			}
		}
		// Retired in the store first, each checked unused in the same transaction: a
		// gateway whose ring is older than the file, still sealing under one of them,
		// either got its value counted (the key stays) or has it refused afterwards and
		// seals it again under the current key. Only then out of the file.
		drop, err := ss.RetireUnusedKeys(ctx, old)
		if err != nil {
			return err
		}
		if len(drop) == 0 {
			_, _ = fmt.Fprintln(w, "no key to remove: every old key still seals values (run reseal) or there is none")
			return keyStatus(ctx, path, ss, w)
		}
		if err := secretbox.RemoveKeys(path, drop); err != nil {
			return err
		}
		_, _ = fmt.Fprintf(w, "removed keys %s from %s\n", strings.Join(drop, ", "), path)
		return keyStatus(ctx, path, ss, w)
	}
	return keyStatus(ctx, path, ss, w)
}

// reseal re-encrypts every value sealed under another key than the key file's current
// one, page by page; values that do not open are counted and reported, never dropped.
func reseal(ctx context.Context, path string, ss store.SecretStores, w io.Writer) error {
	r, err := secretbox.Load(path)
	if err != nil {
		return err
	}
	cur := r.CurrentID()
	var moved, skipped, failed int
	var after *store.Secret
	for {
		page, err := ss.SealedNotUnder(ctx, cur, after, store.MaxPageSize)
		if err != nil {
			return err
		}
		if len(page) == 0 {
			break
		}
		for i := range page {
			x := page[i]
			plain, err := r.Open(x.KeyID, x.Ciphertext, secretbox.AD(x.Org, x.Store, x.Path, x.Field))
			if err != nil {
				failed++
				_, _ = fmt.Fprintf(w, "cannot open org %s store %s path %s field %q (key %s): %v\n", x.Org, x.Store, x.Path, x.Field, x.KeyID, err)
				continue
			}
			kid, ct := r.Seal(plain, secretbox.AD(x.Org, x.Store, x.Path, x.Field))
			clear(plain)
			if kid != cur {
				return fmt.Errorf("the key file changed during reseal (current key %s, now %s): run reseal again", cur, kid)
			}
			did, err := ss.Reseal(ctx, x, kid, ct)
			if err != nil {
				return fmt.Errorf("reseal (%d moved so far; run reseal again): %w", moved, err)
			}
			if did {
				moved++
			} else {
				skipped++ // replaced or deleted meanwhile
			}
		}
		after = &page[len(page)-1]
	}
	_, _ = fmt.Fprintf(w, "resealed %d values under key %s (%d changed meanwhile, left as they are)\n", moved, cur, skipped)
	if failed > 0 {
		return fmt.Errorf("%d values do not open with the keys of %s: they keep their key (put them again, or restore the key that sealed them)", failed, path)
	}
	return nil
}

func keyStatus(ctx context.Context, path string, ss store.SecretStores, w io.Writer) error {
	r, err := secretbox.Load(path)
	if err != nil {
		return err
	}
	use, err := ss.KeyUsage(ctx)
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintf(w, "%s:\n", path)
	for _, id := range r.IDs() {
		mark := ""
		if id == r.CurrentID() {
			mark = " (current)"
		} else if use[id] == 0 {
			mark = " (unused: prune removes it)"
		}
		_, _ = fmt.Fprintf(w, "  %s  %d values%s\n", id, use[id], mark)
		delete(use, id)
	}
	for id, n := range use {
		_, _ = fmt.Fprintf(w, "  %s  %d values: NOT IN THE KEY FILE (they do not open)\n", id, n)
	}
	return nil
}
