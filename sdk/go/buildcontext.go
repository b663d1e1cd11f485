package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// Bounds of a packed build context: the server's defaults (sandboxd.build.v1
// StartBuildRequest.context), so a context PackBuildContext accepts is one a default
// gateway accepts.
const (
	DefaultMaxContextArchive = 64 << 20 // the archive as sent (compressed)
	DefaultMaxContextBytes   = 1 << 30  // regular files' bytes, unpacked
	DefaultMaxContextEntries = 100000   // files, directories and symlinks
	// maxIgnoreFileBytes bounds a .dockerignore.
	maxIgnoreFileBytes = 1 << 20
)

// ErrContextTooLarge: the build context exceeds PackOptions' bounds.
var ErrContextTooLarge = errors.New("build context too large")

// PackOptions configure PackBuildContext. Zero bounds are the defaults above.
type PackOptions struct {
	// Dockerfile is the Dockerfile's path relative to the directory, "/"-separated,
	// without ".." ("" = "Dockerfile"). It must be a regular file inside the directory
	// (no symlink on its way) and is packed even when .dockerignore excludes it.
	Dockerfile string
	// MaxArchiveBytes bounds the archive (compressed), MaxBytes the regular files'
	// bytes and MaxEntries the entries (the root included).
	MaxArchiveBytes int64
	MaxBytes        int64
	MaxEntries      int64
}

// BuildContext is a packed build context.
type BuildContext struct {
	// Archive is the fsarchive archive (zstd-compressed PAX tar, canonical order) that
	// StartBuild sends.
	Archive []byte
	// Dockerfile is the Dockerfile's path inside it.
	Dockerfile string
	Entries    int64 // entries packed (the root included)
	Bytes      int64 // regular files' bytes packed (before compression)
	// Skipped counts device nodes, fifos and sockets left out (not what .dockerignore
	// excluded).
	Skipped int64
}

// PackBuildContext packs the directory dir into a build context archive, the way
// `docker build` sends one: the .dockerignore at its top (if any) excludes what its
// patterns match (Docker's syntax and rules, github.com/moby/patternmatcher; the
// Dockerfile and the .dockerignore are always packed), symlinks are stored as symlinks
// and never followed (one pointing out of dir packs as that link), device nodes, fifos
// and sockets are left out, and the bounds of opts are enforced while packing
// (ErrContextTooLarge). The tree is read by file descriptor from dir (Linux only).
func PackBuildContext(ctx context.Context, dir string, opts PackOptions) (*BuildContext, error) {
	df, err := cleanDockerfilePath(opts.Dockerfile)
	if err != nil {
		return nil, err
	}
	if err := checkDockerfile(dir, df); err != nil {
		return nil, err
	}
	filter, err := readIgnoreFile(dir, df)
	if err != nil {
		return nil, err
	}
	if opts.MaxArchiveBytes <= 0 {
		opts.MaxArchiveBytes = DefaultMaxContextArchive
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxContextBytes
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxContextEntries
	}
	bc, err := packDir(ctx, dir, filter, opts)
	if err != nil {
		return nil, err
	}
	bc.Dockerfile = df
	return bc, nil
}

// cleanDockerfilePath checks the Dockerfile's path inside the context.
func cleanDockerfilePath(p string) (string, error) {
	if p == "" {
		return "Dockerfile", nil
	}
	p = filepath.ToSlash(p)
	if !filepath.IsLocal(filepath.FromSlash(p)) || strings.Contains(p, "\x00") {
		return "", fmt.Errorf("sandbox: the Dockerfile path %q must be relative to the context directory and stay inside it", p)
	}
	return path.Clean(p), nil
}

// checkDockerfile: df is a regular file under dir, reached without a symlink (a symlink
// is packed as one, so the builder would not find the file).
func checkDockerfile(dir, df string) error {
	p := dir
	parts := strings.Split(df, "/")
	for i, part := range parts {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sandbox: no Dockerfile %s in the context directory %s", df, dir)
		}
		if err != nil {
			return fmt.Errorf("sandbox: the Dockerfile: %w", err)
		}
		last := i == len(parts)-1
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("sandbox: the Dockerfile %s is reached through the symlink %s, which the context keeps as a symlink: name the file itself", df, path.Join(parts[:i+1]...))
		case last && !fi.Mode().IsRegular():
			return fmt.Errorf("sandbox: the Dockerfile %s is not a regular file", df)
		case !last && !fi.IsDir():
			return fmt.Errorf("sandbox: no Dockerfile %s in the context directory %s", df, dir)
		}
	}
	return nil
}

// readIgnoreFile reads dir/.dockerignore into a filter (nil: no .dockerignore).
func readIgnoreFile(dir, dockerfile string) (*ignoreFilter, error) {
	f, err := os.Open(filepath.Join(dir, ".dockerignore"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: .dockerignore: %w", err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxIgnoreFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("sandbox: .dockerignore: %w", err)
	}
	if len(b) > maxIgnoreFileBytes {
		return nil, fmt.Errorf("sandbox: .dockerignore is larger than %d KiB", maxIgnoreFileBytes>>10)
	}
	return newIgnoreFilter(b, dockerfile)
}

// newIgnoreFilter parses .dockerignore content b; the Dockerfile and the .dockerignore
// are kept whatever it says (as docker build does).
func newIgnoreFilter(b []byte, dockerfile string) (*ignoreFilter, error) {
	patterns, err := ignorefile.ReadAll(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("sandbox: .dockerignore: %w", err)
	}
	if len(patterns) == 0 {
		return nil, nil
	}
	patterns = append(patterns, "!"+dockerfile, "!.dockerignore")
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf("sandbox: .dockerignore: %w", err)
	}
	return &ignoreFilter{pm: pm, parents: map[string]patternmatcher.MatchInfo{}}, nil
}

// ignoreFilter applies .dockerignore patterns to a walk that asks for parents first.
type ignoreFilter struct {
	pm      *patternmatcher.PatternMatcher
	parents map[string]patternmatcher.MatchInfo // directories' results
}

// decision is what happens to the entry at p ("/"-separated, relative): included,
// excluded (a directory with everything below it), or, for an excluded directory an
// exception ("!pattern") may reach into, excluded unless something below it is included
// (docker build's walk: the exception must start with the directory's path).
func (f *ignoreFilter) decide(p string, dir bool) (include, descend bool, err error) {
	var parent patternmatcher.MatchInfo
	if d := path.Dir(p); d != "." {
		parent = f.parents[d]
	}
	skip, info, err := f.pm.MatchesUsingParentResults(p, parent)
	if err != nil {
		return false, false, err
	}
	if dir {
		f.parents[p] = info
	}
	if !skip {
		return true, dir, nil
	}
	if !dir || !f.pm.Exclusions() {
		return false, false, nil
	}
	prefix := p + "/"
	for _, pat := range f.pm.Patterns() {
		if pat.Exclusion() && strings.HasPrefix(pat.String()+"/", prefix) {
			return false, true, nil
		}
	}
	return false, false, nil
}

// limitWriter fails a write that would take it past max bytes.
type limitWriter struct {
	buf bytes.Buffer
	max int64
}

func (w *limitWriter) Write(b []byte) (int, error) {
	if int64(w.buf.Len())+int64(len(b)) > w.max {
		return 0, fmt.Errorf("%w: the archive exceeds %d bytes", ErrContextTooLarge, w.max)
	}
	return w.buf.Write(b)
}
