package fsarchive

import (
	"archive/tar"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

// WriteFiles writes an archive of a root directory holding only files (name -> content),
// each a regular file of mode 0644 owned by 0:0 with mtime 0 (so equal files give equal
// bytes): the build context the gateway makes for a Compose service whose Dockerfile is
// inline. A name must be one path component (no '/', not "." or "..", at most MaxName
// bytes).
func WriteFiles(w io.Writer, files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for n := range files {
		if n == "" || n == "." || n == ".." || strings.ContainsAny(n, "/\x00") || len(n) > MaxName {
			return fmt.Errorf("fsarchive: %q: a file name is one path component: %w", clip(n), ErrInvalid)
		}
		names = append(names, n)
	}
	slices.Sort(names)
	enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(MaxWindow))
	if err != nil {
		return fmt.Errorf("fsarchive: zstd: %w", err)
	}
	tw := tar.NewWriter(enc)
	epoch := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return fmt.Errorf("fsarchive: %w", err)
	}
	for _, n := range names {
		b := files[n]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return fmt.Errorf("fsarchive: %q: %w", n, err)
		}
		if _, err := tw.Write(b); err != nil {
			return fmt.Errorf("fsarchive: %q: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("fsarchive: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("fsarchive: zstd: %w", err)
	}
	return nil
}
