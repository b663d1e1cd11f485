package local

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ociRuntime drives one OCI runtime CLI (runc, runsc) with a state root of our own.
type ociRuntime struct {
	class  string
	binary string
	// exe is what is executed for binary: its sealed copy for runc (runcsealed.go),
	// else binary.
	exe  string
	root string
	// crun: the binary is crun (ocichoice.go), not runc.
	crun bool
	// gvisor: the binary is runsc (see gvisor.go): global flags, no inherited agent
	// socket, no OCI seccomp, signals through the CLI, no warm pool.
	gvisor bool
	// flags are more global flags (see bootRuntime).
	flags []string
	// extra are flags after the global ones (runsc: an engine sandbox's --net-raw).
	extra []string
}

func newOCIRuntime(class, binary, root string) *ociRuntime {
	return &ociRuntime{class: class, binary: binary, exe: binary, root: root, gvisor: isGVisor(class, binary), crun: isCrun(binary)}
}

func (r *ociRuntime) command(ctx context.Context, args ...string) *exec.Cmd {
	global := []string{"--root", r.root}
	if r.gvisor {
		global = append(global, runscFlags...)
	}
	global = append(global, r.flags...)
	global = append(global, r.extra...)
	cmd := exec.CommandContext(ctx, r.exe, append(global, args...)...)
	cmd.Args[0] = r.binary
	return cmd
}

// run runs a short command and returns its combined output in the error.
func (r *ociRuntime) run(ctx context.Context, args ...string) ([]byte, error) {
	args, rid, err := r.gvisorArgs(args) // runsc's ids (gvisor.go)
	if err != nil {
		return nil, err
	}
	cmd := r.command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if rid != "" && (err != nil || args[0] == "delete") {
		r.dropStaleLocks(rid)
	}
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", r.class, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// start runs the container detached. extra, when not nil, becomes fd 3 in the container;
// stdio goes to the file out (the container's stdio too).
func (r *ociRuntime) start(ctx context.Context, id, bundle, pidFile string, extra *os.File, out *os.File) error {
	args := []string{"run", "--detach", "--pid-file", pidFile}
	if extra != nil {
		args = append(args, "--preserve-fds", "1")
	}
	cmd := r.command(ctx, append(args, "--bundle", bundle, r.runscID(id))...)
	if extra != nil {
		cmd.ExtraFiles = []*os.File{extra}
	}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s run %s: %w: %s", r.class, id, err, tailOf(out.Name(), 1024))
	}
	return nil
}

// create creates container id detached (`runsc create`: a gVisor sandbox's sentry and
// gofer run, and wait for a start or, as a fork's does, a restore into it); stdio goes
// to the file out.
func (r *ociRuntime) create(ctx context.Context, id, bundle, pidFile string, out *os.File) error {
	cmd := r.command(ctx, "create", "--pid-file", pidFile, "--bundle", bundle, r.runscID(id))
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s create %s: %w: %s", r.class, id, err, tailOf(out.Name(), 1024))
	}
	return nil
}

// restoreBackground: `runsc restore --background` returns once the kernel's state is
// loaded and lets the restored sandbox run while the memory image's pages load (a page
// touched first waits for its load). The checkpoints are uncompressed, which it needs.
// runsc opens the image's files before it returns and hands them to the sentry, which
// reads the pages from its own descriptor: the image's names may go (the checkpoint
// dir is removed as before) and its space is freed when the sentry closes the pages
// file, after the load (`runsc wait --restore` returns then) or when it dies. A
// checkpoint taken meanwhile waits for the load (gVisor's MemoryFile.SaveTo).
var restoreBackground = true

// restore starts container id detached from the checkpoint in image (runsc restore),
// like start; a container made by create is restored into (runsc then only loads the
// image into its sandbox).
func (r *ociRuntime) restore(ctx context.Context, id, bundle, image, pidFile string, out *os.File) error {
	args := []string{"restore", "--detach", "--image-path=" + image, "--pid-file", pidFile, "--bundle", bundle}
	if restoreBackground {
		args = append(args, "--background")
	}
	cmd := r.command(ctx, append(args, r.runscID(id))...)
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s restore %s: %w: %s", r.class, id, err, tailOf(out.Name(), 1024))
	}
	return nil
}

// kill sends sig (a name like TERM or KILL) to the container's init through the CLI.
func (r *ociRuntime) kill(ctx context.Context, id, sig string) error {
	_, err := r.run(ctx, "kill", id, sig)
	return err
}

// delete removes a stopped container's runtime state and cgroups. A container the runtime
// does not know is not an error.
func (r *ociRuntime) delete(ctx context.Context, id string) error {
	_, err := r.run(ctx, "delete", id)
	if err != nil && !notExist(err) {
		return err
	}
	return nil
}

type containerState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"` // created, running, paused, stopped
}

// list returns the containers under this runtime's root by id.
func (r *ociRuntime) list(ctx context.Context) (map[string]containerState, error) {
	if _, err := os.Stat(r.root); os.IsNotExist(err) {
		return map[string]containerState{}, nil
	}
	out, err := r.run(ctx, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var cs []containerState
	if s := bytes.TrimSpace(out); len(s) > 0 && !bytes.Equal(s, []byte("null")) {
		if err := json.Unmarshal(s, &cs); err != nil {
			return nil, fmt.Errorf("%s list: %w", r.class, err)
		}
	}
	m := make(map[string]containerState, len(cs))
	for _, c := range cs {
		c.ID = r.fromRunscID(c.ID)
		m[c.ID] = c
	}
	return m, nil
}

// notExist says whether err is the runtime's "no such container": runc's "container
// does not exist", runsc's "not found", crun's missing state file or dir ("error opening
// file `<root>/<id>/status`: No such file or directory", or for delete "cannot open
// directory '<root>/<id>': No such file or directory").
func notExist(err error) bool {
	s := err.Error()
	if strings.Contains(s, "does not exist") || strings.Contains(s, "not found") {
		return true
	}
	return strings.Contains(s, "No such file or directory") &&
		(strings.Contains(s, "/status`") || strings.Contains(s, "cannot open directory '"))
}

// tailOf returns up to n trailing bytes of a file, for error messages.
func tailOf(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	b := make([]byte, st.Size()-off)
	n2, _ := f.ReadAt(b, off)
	return strings.TrimSpace(string(b[:n2]))
}
