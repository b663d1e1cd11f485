package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// freshSandboxdDir makes agentconfig.Dir (/.sandboxd) of the root filesystem mounted
// at rootfs a directory of the backend's, empty, before the runtime mounts anything
// under it: whatever the image's layers or the sandbox's upper layer have there (a
// snapshot's, a fork's, a restored sandbox's) is removed first. The runtime resolves
// mount destinations inside the root filesystem following symlinks, and the sandbox's
// volumes are mounted after the agent's files: an image with /.sandboxd (or
// /.sandboxd/seccomp.bpf) a symlink into a volume would otherwise have the agent's
// binary or its seccomp filter mounted where the volume hides them, and the runtime
// execute (or the agent install) what the volume holds. Every runtime class.
//
// Nothing is followed: the entry is unlinked (os.RemoveAll removes a symlink, not
// what it names, and descends with O_NOFOLLOW), and the directory is made and owned
// by name relative to a descriptor of rootfs itself. With ids (a user namespace) it
// is owned by the sandbox's root, as the runtime would have made it.
// maxSandboxdEntries bounds what freshSandboxdDir removes of an image's /.sandboxd.
const maxSandboxdEntries = 1024

var errTooManyEntries = errors.New("too many entries")

func freshSandboxdDir(rootfs string, ids *idRange) error {
	name := filepath.Base(agentconfig.Dir)
	if filepath.Join("/", name) != agentconfig.Dir {
		return fmt.Errorf("%s is not a top-level directory", agentconfig.Dir)
	}
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: open root filesystem: %w", agentconfig.Dir, err)
	}
	defer unix.Close(root)
	// RemoveAll by the descriptor's path: rootfs is the backend's mount point, and the
	// one component under it is what is removed.
	path := filepath.Join(fmt.Sprintf("/proc/self/fd/%d", root), name)
	// Bounded: each entry removed from a lower layer costs a whiteout in the sandbox's
	// upper layer, and an image can pack a million empty files in a few MB.
	var st unix.Stat_t
	if err := unix.Fstatat(root, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		n := 0
		err := filepath.WalkDir(path, func(p string, _ fs.DirEntry, err error) error {
			if p == path { // the directory itself
				return err
			}
			if n++; n > maxSandboxdEntries {
				return errTooManyEntries
			}
			return err
		})
		if errors.Is(err, errTooManyEntries) {
			return fmt.Errorf("%w: the image has more than %d entries under %s, a path the sandbox's agent owns", runtime.ErrInvalidSpec, maxSandboxdEntries, agentconfig.Dir)
		}
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("%s: remove the image's: %w", agentconfig.Dir, err)
	}
	if err := unix.Mkdirat(root, name, 0o755); err != nil {
		return fmt.Errorf("%s: %w", agentconfig.Dir, err)
	}
	uid, gid := 0, 0
	if ids != nil {
		uid, gid = int(ids.HostID), int(ids.HostID)
	}
	if err := unix.Fchownat(root, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", agentconfig.Dir, err)
	}
	if err := unix.Fchmodat(root, name, 0o755, 0); err != nil { // not under the umask
		return fmt.Errorf("%s: %w", agentconfig.Dir, err)
	}
	return nil
}
