package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
)

// packDir writes the archive with fsarchive (the format's one home), filtered and
// bounded.
func packDir(ctx context.Context, dir string, filter *ignoreFilter, opts PackOptions) (*BuildContext, error) {
	root, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: the context directory: %w", err)
	}
	defer func() { _ = root.Close() }()
	wopts := fsarchive.WriteOptions{MaxEntries: opts.MaxEntries, MaxBytes: opts.MaxBytes}
	if filter != nil {
		wopts.Filter = func(p string, isDir bool) (fsarchive.Decision, error) {
			include, descend, err := filter.decide(p, isDir)
			switch {
			case err != nil:
				return fsarchive.Skip, err
			case include:
				return fsarchive.Keep, nil
			case descend:
				return fsarchive.SkipUnlessContent, nil
			}
			return fsarchive.Skip, nil
		}
	}
	w := &limitWriter{max: opts.MaxArchiveBytes}
	st, err := fsarchive.WriteWith(ctx, root, w, wopts)
	if err != nil {
		if errors.Is(err, fsarchive.ErrTooLarge) {
			return nil, fmt.Errorf("sandbox: packing %s: %w: %w", dir, ErrContextTooLarge, err)
		}
		return nil, fmt.Errorf("sandbox: packing %s: %w", dir, err)
	}
	return &BuildContext{Archive: w.buf.Bytes(), Entries: st.Files, Bytes: st.Bytes, Skipped: st.Skipped}, nil
}
