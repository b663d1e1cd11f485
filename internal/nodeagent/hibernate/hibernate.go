// Package hibernate is a client of gVisor's hibernate task server: the ttrpc service
// gvisor.task.TaskService that gVisor's containerd shim (containerd-shim-runsc-v1) serves
// per Pod sandbox on <shim root>/<sandbox id>_sandbox.sock when its config sets
// enable_hibernate_server (scripts/build-runsc-shim.sh, test/k8s/up.sh). Checkpoint runs
// `runsc checkpoint` of the sandbox through the shim's own runsc (right root, right
// binary); Wait{CHECKPOINT} waits for one to finish. The patched shim restores a Pod from
// such an image when the Pod has runtime.RestoreCheckpointAnnotation naming it.
//
// It is the start of the node agent (pause, resume and fork of gVisor sandboxes on
// Kubernetes nodes): the agent resolves the sandbox, makes the image directory
// (CreateImageDir) and checkpoints it here.
//
// The ttrpc framing and the few messages are encoded here (protowire), not with
// containerd's ttrpc library and gVisor's generated types: the wire format is small and
// fixed, and it keeps those modules out of sandboxd's. Field numbers follow gVisor's
// pkg/shim/v1/taskserver/task_server.proto and ttrpc's request.proto.
package hibernate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// RestoreAnnotation is the Pod annotation the patched shim restores from.
const RestoreAnnotation = runtime.RestoreCheckpointAnnotation

// checkpointID is the shim patch's pattern (scripts/runsc-shim/zz_sandboxd_restore.go.in):
// an opaque name, one path element, never "." or "..".
var checkpointID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// containerID is containerd's identifier pattern (its identifiers package), at most 76
// characters: CRI's sandbox and container IDs are 64 hex digits.
var containerID = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

// ErrInvalid is wrapped by every error about a bad ID or path.
var ErrInvalid = errors.New("hibernate: invalid")

// ValidCheckpointID reports whether id names a checkpoint image the shim would restore.
func ValidCheckpointID(id string) error {
	if !checkpointID.MatchString(id) {
		return fmt.Errorf("%w checkpoint id %q: want [a-z0-9][a-z0-9-]{0,62}", ErrInvalid, clip(id))
	}
	return nil
}

// ValidContainerID reports whether id is a containerd container (or sandbox) ID.
func ValidContainerID(id string) error {
	if len(id) > 76 || !containerID.MatchString(id) {
		return fmt.Errorf("%w container id %q: want containerd's identifier, at most 76 characters", ErrInvalid, clip(id))
	}
	return nil
}

// SocketPath is where the shim of the Pod sandbox sandboxID serves the hibernate server:
// <shimRoot>/<sandboxID>_sandbox.sock (shimRoot: the `root` of the shim's config, by
// default /run/containerd/runsc).
func SocketPath(shimRoot, sandboxID string) (string, error) {
	if err := absClean(shimRoot); err != nil {
		return "", err
	}
	if err := ValidContainerID(sandboxID); err != nil {
		return "", err
	}
	p := filepath.Join(shimRoot, sandboxID+"_sandbox.sock")
	if len(p) > maxSocketPath {
		// The shim could not have listened there either (it logs it and serves nothing).
		return "", fmt.Errorf("%w socket path %s: longer than a unix socket's %d bytes (a shorter shim root)", ErrInvalid, clip(p), maxSocketPath)
	}
	return p, nil
}

// maxSocketPath is the longest path a Linux sockaddr_un holds (108 bytes with the NUL).
const maxSocketPath = 107

// CompleteMarker is the file MarkComplete writes into an image directory once its
// checkpoint succeeded; the shim restores only an image directory that holds it (a regular
// file owned by root, writable only by it): a failed checkpoint leaves an empty or partial
// directory (CreateImageDir makes it first) that a restore would fail on late.
const CompleteMarker = "sandboxd-complete"

// ErrIncomplete is wrapped by ImageDir's error for an image directory without its
// CompleteMarker.
var ErrIncomplete = errors.New("hibernate: incomplete checkpoint image")

// ImageDir is the image directory of checkpoint id under root, as the shim resolves it
// for a restore, with the shim's checks: root and <root>/<id> are directories (not
// symlinks) owned by root and writable by no one else, each parent of root is root's and
// not writable by group or others unless sticky, and <root>/<id> holds CompleteMarker.
func ImageDir(root, id string) (string, error) {
	dir, err := checkedImagePath(root, id)
	if err != nil {
		return "", err
	}
	if err := rootOnlyDir(dir); err != nil {
		return "", err
	}
	fi, err := os.Lstat(filepath.Join(dir, CompleteMarker))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: %s has no %s", ErrIncomplete, dir, CompleteMarker)
	}
	if err != nil {
		return "", fmt.Errorf("hibernate: %w", err)
	}
	if st, _ := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 || st == nil || st.Uid != 0 {
		return "", fmt.Errorf("%w: %s/%s is not a regular file owned by root and writable only by it", ErrInvalid, dir, CompleteMarker)
	}
	return dir, nil
}

// MarkComplete writes CompleteMarker (mode 0600) into image directory dir after its
// checkpoint succeeded, and syncs it and the directory: from then on the shim restores
// it. dir must be a directory owned by root and writable only by it; an existing marker
// is an error (os.ErrExist).
func MarkComplete(dir string) error {
	if err := absClean(dir); err != nil {
		return err
	}
	if err := rootOnlyDir(dir); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, CompleteMarker), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("hibernate: marker: %w", err)
	}
	err = f.Chmod(0o600) // the umask may have taken bits; never adds
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("hibernate: marker: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("hibernate: marker: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("hibernate: marker: %w", err)
	}
	return nil
}

// CreateImageDir makes the (new, empty) image directory of checkpoint id under root, mode
// 0700: root must pass ImageDir's checks; an existing <root>/<id> is an error
// (os.ErrExist), never reused.
func CreateImageDir(root, id string) (string, error) {
	dir, err := checkedImagePath(root, id)
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("hibernate: image dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil { // the umask may have taken bits; never adds
		return "", fmt.Errorf("hibernate: image dir: %w", err)
	}
	return dir, nil
}

// checkedImagePath is <root>/<id> once root is absolute and clean, id a checkpoint ID,
// root's parents root-owned (rootOwnedParents) and root itself root's only (rootOnlyDir):
// the checks ImageDir and CreateImageDir share, before either looks at the image directory.
func checkedImagePath(root, id string) (string, error) {
	if err := absClean(root); err != nil {
		return "", err
	}
	if err := ValidCheckpointID(id); err != nil {
		return "", err
	}
	if err := rootOwnedParents(root); err != nil {
		return "", err
	}
	if err := rootOnlyDir(root); err != nil {
		return "", err
	}
	return filepath.Join(root, id), nil
}

func absClean(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%w path %q: want an absolute, clean path", ErrInvalid, clip(p))
	}
	return nil
}

// rootOwnedParents: each parent directory of p (absolute, clean) up to / is owned by uid
// 0 and not writable by group or others unless sticky (/tmp): no one else could swap a
// path element of p (the shim patch checks the same).
func rootOwnedParents(p string) error {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("hibernate: %w", err)
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || st == nil || st.Uid != 0 || (fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0) {
			return fmt.Errorf("%w: %s (a parent of %s) is not a directory owned by root and writable only by it (or sticky)", ErrInvalid, d, p)
		}
		if d == "/" {
			return nil
		}
	}
}

// rootOnlyDir: p is a directory (Lstat: not a symlink) owned by uid 0, not writable by
// group or others.
func rootOnlyDir(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("hibernate: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 || st == nil || st.Uid != 0 {
		return fmt.Errorf("%w: %s is not a directory owned by root and writable only by it", ErrInvalid, p)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
