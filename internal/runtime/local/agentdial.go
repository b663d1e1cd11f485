package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// Reaching an agent. The runner (host root) never resolves a path a sandbox can change:
//
//   - runc: the backend binds the agent's listening socket at <dir>/agent.sock, in the
//     sandbox's dir, which is the host's alone (0700, never mounted into the sandbox), and
//     hands the agent the listening descriptor (fd 3). Nothing inside can see or replace it.
//   - gVisor: the agent must bind the socket itself, in the shared run dir, where runsc's
//     gofer creates it on the host (see gvisor.go). The sandbox can replace that entry.
//
// Either way the socket is opened beneath the sandbox's dir with openat2 refusing every
// symlink (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), checked to be a socket, and connected
// through its descriptor; and every connection then runs the identity handshake
// (agent.VerifyIdentity), so one that reaches another sandbox's agent fails closed.

// agentSocketPaths are the places of a sandbox's agent socket, relative to its dir, in
// the order they are tried: the host-only one of runc sandboxes, then the run dir's (gVisor,
// and runc sandboxes created before the socket moved), on the sandbox's disk or not.
var agentSocketPaths = []string{agentSocket, dirShown + "/" + dirRun + "/" + agentSocket, dirRun + "/" + agentSocket}

// shownDir is where the files mounted into the sandbox in dir live. On the sandbox's
// own disk filesystem when it has one, so that the sandbox's mountinfo names paths of
// that filesystem (/.sandboxd/run) and no host path of the state dir; otherwise (no disk
// limit, or a sandbox made before) dir itself. The disk filesystem's root is the host's:
// the sandbox sees only the subdirectories mounted into it.
func shownDir(dir string) string {
	if fi, err := os.Lstat(filepath.Join(dir, dirShown)); err == nil && fi.IsDir() {
		return filepath.Join(dir, dirShown)
	}
	return dir
}

// shownRel is shownDir relative to dir, with a trailing slash ("" for dir itself).
func shownRel(dir string) string {
	if s := shownDir(dir); s != dir {
		return dirShown + "/"
	}
	return ""
}

// errNoSocket is a sandbox dir with no agent socket (yet, or any more).
var errNoSocket = errors.New("no agent socket")

// dialAgentSocket connects to the agent socket of the sandbox in dir without following
// any symlink.
func dialAgentSocket(ctx context.Context, dir string) (net.Conn, error) {
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(d)
	var last error = errNoSocket
	for _, rel := range agentSocketPaths {
		fd, err := unix.Openat2(d, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("agent socket (%s): %w", rel, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			err = fmt.Errorf("not a socket (mode %#o): refusing to follow it", st.Mode&unix.S_IFMT)
		}
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("agent socket (%s): %w", rel, err)
		}
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
		unix.Close(fd)
		if err != nil {
			last = fmt.Errorf("agent socket (%s): %w", rel, err)
			continue
		}
		return c, nil
	}
	return nil, last
}

// dialVerified connects to the agent of the container in dir and checks that it is
// the one with identity id (nil: a sandbox made before identities, not checked).
func dialVerified(ctx context.Context, dir string, id *agentconfig.Identity) (net.Conn, error) {
	c, err := dialAgentSocket(ctx, dir)
	if err != nil {
		return nil, err
	}
	if id == nil {
		return c, nil
	}
	if err := agent.VerifyIdentity(ctx, c, id); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// identityOf returns the agent identity recorded for sandbox id: the tracked sandbox's,
// or its info.json's.
func (b *Backend) identityOf(id string) *agentconfig.Identity {
	b.mu.Lock()
	s := b.sandboxes[id]
	var ident *agentconfig.Identity
	if s != nil {
		ident = s.ident
	}
	b.mu.Unlock()
	if s != nil {
		return ident // nil for a sandbox made before identities: its info has none either
	}
	var pi persistedInfo
	if err := readJSON(filepath.Join(b.dir(id), fileInfo), &pi); err == nil {
		return pi.Agent
	}
	return nil
}

// maxStatusBytes bounds status.json as the host reads it (the agent writes a few hundred
// bytes; the sandbox could write anything).
const maxStatusBytes = 1 << 20

// readSandboxFile reads the regular file rel beneath dir, refusing symlinks anywhere on
// the way and anything but a regular file, and at most max bytes: for files in the run
// dir, which the sandbox can write.
func readSandboxFile(dir, rel string, max int64) ([]byte, error) {
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(d)
	fd, err := unix.Openat2(d, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: filepath.Join(dir, rel), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, rel))
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", f.Name())
	}
	if st.Size() > max {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d allowed", f.Name(), st.Size(), max)
	}
	return io.ReadAll(io.LimitReader(f, max))
}
