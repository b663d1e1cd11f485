package local

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// overlayOptions builds the mount data for an overlay over layers (BOTTOM first). The
// kernel takes at most one page of mount data.
func overlayOptions(layers []string, upper, work string) (string, error) {
	if len(layers) == 0 {
		return "", errors.New("image has no layers")
	}
	var b strings.Builder
	b.WriteString("lowerdir=")
	for i := len(layers) - 1; i >= 0; i-- {
		l := layers[i]
		if !strings.HasPrefix(l, "/") || strings.ContainsAny(l, ",:\\") {
			return "", fmt.Errorf("layer path %q: must be absolute and contain no ',', ':' or '\\'", l)
		}
		b.WriteString(l)
		if i > 0 {
			b.WriteByte(':')
		}
	}
	for _, d := range []string{upper, work} {
		if strings.ContainsAny(d, ",:\\") {
			return "", fmt.Errorf("overlay dir %q contains ',', ':' or '\\'", d)
		}
	}
	b.WriteString(",upperdir=" + upper + ",workdir=" + work)
	if max := os.Getpagesize() - 1; b.Len() > max {
		return "", fmt.Errorf("image has too many layers for one overlay mount: %d layers need %d bytes of mount options, the limit is %d", len(layers), b.Len(), max)
	}
	return b.String(), nil
}

func mountOverlay(target, opts string) error {
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}

// unmountAll unmounts target (and anything stacked on it) until it is no longer a mount
// point; a busy mount is detached instead.
func unmountAll(target string) error {
	for i := 0; i < 8; i++ {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more), or gone
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("detach %s: %w", target, err)
			}
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted", target)
}
