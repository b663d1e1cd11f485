// Package blob is sandboxd's blob store: named, immutable byte streams (snapshots,
// checkpoints, global volumes, registry storage) behind one small interface in the manner
// of containerd's content store. Two implementations: internal/blob/dir (the embedded
// default, a directory under the data dir) and internal/blob/s3 (any S3-compatible
// service). Both stream (nothing buffers a whole object), record each object's sha256 and
// check it on Get, and pass the one conformance suite in internal/blob/blobtest.
//
// Keys are caller-controlled and never trusted: ValidateKey is the one rule, and every
// implementation applies it before touching storage.
package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

var (
	// ErrNotFound: no object has that key. It is an errdefs.ErrNotFound.
	ErrNotFound = fmt.Errorf("blob %w", errdefs.ErrNotFound)
	// ErrInvalidKey: a key or prefix breaks ValidateKey's rule.
	ErrInvalidKey = errors.New("invalid blob key")
	// ErrCorrupt: an object's content does not match the sha256 (or size) recorded when it
	// was put: it was altered in storage. Get's reader returns it at the end of the stream
	// instead of io.EOF, so a reader that reads to the end never takes tampered bytes as good.
	ErrCorrupt = errors.New("blob content does not match its recorded sha256")
	// ErrSizeMismatch: Put was given a size and the reader gave a different number of bytes.
	ErrSizeMismatch = errors.New("blob size does not match the declared size")
)

// MaxKeyLen bounds a key's length in bytes (S3 allows 1024).
const MaxKeyLen = 1024

// MaxComponentLen bounds one "/"-separated component (a file name in the dir store).
const MaxComponentLen = 200

// Info describes a stored object.
type Info struct {
	Key     string
	Size    int64
	SHA256  string // lowercase hex of the content's sha256
	ModTime time.Time
}

// Store is a blob store. Objects are put whole and replaced whole: a reader never sees a
// partly written object.
type Store interface {
	// Put stores r's content under key, replacing any object there. size is the exact
	// length, or -1 when unknown; with size >= 0 a reader giving more or fewer bytes is
	// ErrSizeMismatch and nothing is stored. The content is streamed, never held whole.
	Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error)
	// Get opens key's content. The reader checks the recorded sha256 as it goes and
	// returns ErrCorrupt rather than io.EOF when the content was altered.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat describes key's object, or ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key's object, or ErrNotFound when there is none.
	Delete(ctx context.Context, key string) error
	// List yields the objects whose key starts with prefix ("" for all), in lexical
	// order of key. A prefix must pass ValidatePrefix.
	List(ctx context.Context, prefix string) iter.Seq2[Info, error]
}

// keyChar reports whether c may appear in a key: ASCII letters, digits, '.', '_', '-',
// and '/' as separator.
func keyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/'
}

// ValidateKey is the rule for a key: 1..MaxKeyLen bytes of [A-Za-z0-9._/-], "/"-separated
// components each 1..MaxComponentLen bytes, none "." or ".." and none starting with '.'
// (no hidden names, no traversal), no leading, trailing or doubled "/". The error wraps
// ErrInvalidKey and says what is wrong.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	return validate(key, false)
}

// ValidatePrefix is the rule for List's prefix: "" (everything), or what ValidateKey
// accepts, optionally ending in "/"; its last component may be partial.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return validate(prefix, true)
}

func validate(s string, prefix bool) error {
	if len(s) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(s), MaxKeyLen)
	}
	for i := 0; i < len(s); i++ {
		if !keyChar(s[i]) {
			return fmt.Errorf("%w: %q: byte %d (%q) is not one of [A-Za-z0-9._/-]", ErrInvalidKey, s, i, s[i])
		}
	}
	if prefix {
		s = strings.TrimSuffix(s, "/")
		if s == "" {
			return fmt.Errorf("%w: prefix %q: leading \"/\"", ErrInvalidKey, "/")
		}
	}
	for c := range strings.SplitSeq(s, "/") {
		switch {
		case c == "":
			return fmt.Errorf("%w: %q: empty component (leading, trailing or doubled \"/\")", ErrInvalidKey, s)
		case c[0] == '.':
			return fmt.Errorf("%w: %q: component %q starts with '.'", ErrInvalidKey, s, c)
		case len(c) > MaxComponentLen:
			return fmt.Errorf("%w: %q: a component of %d bytes, more than %d", ErrInvalidKey, s, len(c), MaxComponentLen)
		}
	}
	return nil
}
