// Package mountinfo reads the mount points of this process's mount namespace from
// /proc/self/mountinfo.
package mountinfo

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Points returns every mount point, unescaped, in mountinfo's order (a path mounted more
// than once appears once per mount).
func Points() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 4 {
			out = append(out, unescape(f[4]))
		}
	}
	return out, sc.Err()
}

// IsMountPoint reports whether dir is a mount point.
func IsMountPoint(dir string) (bool, error) {
	ps, err := Points()
	return slices.Contains(ps, dir), err
}

// Under returns the distinct mount points at or below any of dirs, deepest first (the
// order to unmount them in). It reads the mount table once, whatever the number of dirs:
// the table holds a few mounts per sandbox, so a read costs more the more there are.
func Under(dirs ...string) ([]string, error) {
	ps, err := Points()
	if err != nil {
		return nil, err
	}
	clean := make([]string, len(dirs))
	for i, d := range dirs {
		clean[i] = filepath.Clean(d)
	}
	var out []string
	for _, mp := range ps {
		for _, dir := range clean {
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		if d := strings.Count(b, "/") - strings.Count(a, "/"); d != 0 {
			return d
		}
		return strings.Compare(b, a)
	})
	return slices.Compact(out), nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space, and so on).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
