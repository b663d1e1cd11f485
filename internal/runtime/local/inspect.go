package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// LogDir is where the agent keeps the main command's logs on the host. The runner moves
// it out before Destroy, so logs outlive the sandbox.
func (b *Backend) LogDir(id, container string) string {
	if !validID(id) {
		return ""
	}
	dir := b.dir(id)
	if container != "" && validID(container) {
		// A group's member (see group.go); the primary's name has no dir there.
		if fi, err := os.Lstat(memberDir(dir, container)); err == nil && fi.IsDir() {
			dir = memberDir(dir, container)
		}
	}
	return filepath.Join(shownDir(dir), dirRun, agentconfig.LogsDir)
}

// OpenContainerLog opens the log of container ("" = the primary) of sandbox id where its
// agent keeps it, beneath the sandbox's dir (the host's alone). The run dir is mounted
// into the container, whose root can replace the logs dir in it, or anything below, by
// a symlink to another sandbox's logs or a host path: none is followed.
func (b *Backend) OpenContainerLog(id, container string) (*logstore.Reader, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	dir, rel := b.dir(id), ""
	if container != "" && validID(container) {
		if fi, err := os.Lstat(memberDir(dir, container)); err == nil && fi.IsDir() {
			rel = dirMembers + "/" + container + "/"
		}
	}
	rel += shownRel(filepath.Join(dir, rel)) + dirRun + "/" + agentconfig.LogsDir
	return logstore.OpenReaderBeneath(dir, rel, agentconfig.MainLog)
}

// SandboxDir returns the host dir of sandbox id (its files, disk image and mount points),
// for inspection by tests; "" for an invalid id.
func (b *Backend) SandboxDir(id string) string {
	if !validID(id) {
		return ""
	}
	return b.dir(id)
}

// RuntimeCommand returns the OCI runtime CLI (with this backend's state root) for the
// sandbox's runtime class, e.g. to compare `runc exec` with the agent in benchmarks.
// Arguments equal to id are replaced by the container's runtime id (which differs for a
// sandbox started from the warm pool).
func (b *Backend) RuntimeCommand(ctx context.Context, id string, args ...string) (*exec.Cmd, error) {
	s, err := b.get(ctx, id)
	if err != nil {
		return nil, err
	}
	cid := b.containerID(id)
	args = append([]string(nil), args...)
	for i, a := range args {
		if a == id {
			args[i] = cid
		}
	}
	return s.rt.command(ctx, args...), nil
}
