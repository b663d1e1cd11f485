package testenv

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

const agentPkg = "github.com/sandboxd/sandboxd/cmd/sandbox-agent"

// agentBuildFlags are the Makefile's `agent` target's (with CGO_ENABLED=0): the agent
// runs inside arbitrary images, so it must be static, and tests run the binary users do.
var agentBuildFlags = []string{"-trimpath", "-ldflags=-s -w"}

// agentCacheIdle is how long a cached agent nobody asked for is kept. Callers get hard
// links (or copies), so removing an entry never pulls a binary from under a running test.
const agentCacheIdle = time.Hour

var agentOnce struct {
	sync.Once
	path string
	err  error
}

// Agent puts a static sandbox-agent, built from this checkout as `make agent` builds it,
// at dir/sandbox-agent (mode 0755) and returns that path. The build happens once per
// process, and not at all when a binary of the same content is cached: the key is the Go
// build ID of the agent's main package (its sources, every dependency's, the compiler
// and flags), and the cache a directory of this user's below os.TempDir(), so the test
// processes of one `go test ./...` share one build.
func Agent(dir string) (string, error) {
	agentOnce.Do(func() { agentOnce.path, agentOnce.err = cachedAgent() })
	if agentOnce.err != nil {
		return "", agentOnce.err
	}
	out := filepath.Join(dir, "sandbox-agent")
	if err := linkOrCopy(agentOnce.path, out); err != nil {
		return "", fmt.Errorf("sandbox-agent into %s: %w", dir, err)
	}
	return out, nil
}

// cachedAgent returns the cached agent of this checkout's sources, building it first if
// there is none.
func cachedAgent() (string, error) {
	root, err := agentCacheDir()
	if err != nil {
		return "", err
	}
	id, err := goCmd(slices.Concat([]string{"list", "-export", "-f", "{{.BuildID}}"}, agentBuildFlags, []string{agentPkg})...)
	if err != nil {
		return "", fmt.Errorf("sandbox-agent build ID: %w", err)
	}
	key := fmt.Sprintf("%x", sha256.Sum256([]byte(strings.Join(slices.Concat(agentBuildFlags, []string{strings.TrimSpace(id)}), "\x00"))))[:32]
	entry := filepath.Join(root, key)
	bin := filepath.Join(entry, "sandbox-agent")
	if _, err := os.Stat(bin); err == nil {
		now := time.Now()
		_ = os.Chtimes(entry, now, now) // still in use: keep it from pruning
		return bin, nil
	}
	tmp, err := os.MkdirTemp(root, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // after a rename, or when another process won the race
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if _, err := goCmd(slices.Concat([]string{"build"}, agentBuildFlags, []string{"-o", filepath.Join(tmp, "sandbox-agent"), agentPkg})...); err != nil {
		return "", fmt.Errorf("build sandbox-agent: %w", err)
	}
	if err := os.Chmod(filepath.Join(tmp, "sandbox-agent"), 0o755); err != nil { // whatever the umask
		return "", err
	}
	if err := os.Rename(tmp, entry); err != nil {
		if _, serr := os.Stat(bin); serr != nil {
			return "", err
		}
	}
	pruneAgents(root, key)
	return bin, nil
}

// agentCacheDir is $TMPDIR/sandboxd-test-agent-<euid>, world-readable (the agent tests
// run it as nobody). Tests run what is in it as root, so it must be this user's and
// writable by nobody else.
func agentCacheDir() (string, error) {
	root := filepath.Join(os.TempDir(), fmt.Sprintf("sandboxd-test-agent-%d", os.Geteuid()))
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return "", err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || st == nil || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("agent cache %s is not a directory of uid %d writable only by it: remove it", root, os.Geteuid())
	}
	return root, nil
}

// pruneAgents removes the cached agents (and builds of crashed processes) but keep that
// nobody asked for in agentCacheIdle.
func pruneAgents(root, keep string) {
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && e.Name() != keep && time.Since(fi.ModTime()) > agentCacheIdle {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// goCmd runs the go command with CGO_ENABLED=0 in the current directory (a test's
// package directory, inside the module) and returns its stdout.
func goCmd(args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", args[0], err, stderr.String())
	}
	return string(out), nil
}

// linkOrCopy makes dst the file src: a hard link, or a copy across file systems.
func linkOrCopy(src, dst string) error {
	_ = os.Remove(dst)
	if os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
