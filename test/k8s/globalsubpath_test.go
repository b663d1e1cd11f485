package k8s

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// putGeneration commits the tree mk makes as generation gen of the env's volume, as a
// writer elsewhere would have (its archive made by fsarchive.Write: symlinks as symlinks).
func (e *globalEnv) putGeneration(t *testing.T, gen int64, mk func(root string) error) {
	t.Helper()
	ctx := context.Background()
	root := t.TempDir()
	if err := mk(root); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var arch bytes.Buffer
	st, err := fsarchive.Write(ctx, f, &arch, fsarchive.IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	key := runner.GlobalArchiveKey(e.prefix, gen, "elsewhere")
	if _, err := e.blobs.Put(ctx, key, bytes.NewReader(arch.Bytes()), int64(arch.Len())); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(arch.Bytes())
	if err := runner.WriteGlobalManifest(ctx, e.blobs, e.prefix, runner.GlobalManifest{Generation: gen, BlobKey: key, Digest: hex.EncodeToString(sum[:]),
		SizeBytes: int64(arch.Len()), ContentBytes: st.Bytes, Files: st.Files, SandboxID: "elsewhere", CommitTime: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
}

// subPathSandbox creates a sandbox running script with the env's volume mounted at /data
// with sub_path sub (read-only when ro).
func (e *globalEnv) subPathSandbox(t *testing.T, sub string, ro bool, script string) (string, error) {
	t.Helper()
	res, err := e.api.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", script},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: ro, SubPath: sub}}}},
		Volumes: []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}},
	}}}))
	if err != nil {
		return "", err
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = e.api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	return id, nil
}

// TestGlobalVolumeSubPath: GLOBAL volume mounts with a sub_path on a Kubernetes runner
// (docs/volumes.md): a reader of sub_path "dir" sees that directory of the committed
// generation (not the rest of the volume) and cannot write it; a sub_path missing from
// the volume is an empty directory (as on a local runner); a writer of sub_path "dir"
// writes into it, and its commit is the whole volume (the files outside "dir" kept); a
// second sandbox then reads the change through its own sub_path mount.
func TestGlobalVolumeSubPath(t *testing.T) {
	e := newGlobalEnv(t)
	ctx := context.Background()
	e.putGeneration(t, 1, func(root string) error {
		if err := os.MkdirAll(filepath.Join(root, "dir", "deep"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, "dir", "hello.txt"), []byte("in dir\n"), 0o644); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(root, "top.txt"), []byte("at the root\n"), 0o644)
	})
	exec := func(id, script string) (int32, string) {
		t.Helper()
		ex, err := e.api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
		if err != nil {
			t.Fatal(err)
		}
		return ex.Msg.GetExitCode(), string(ex.Msg.GetStdout()) + string(ex.Msg.GetStderr())
	}
	const idle = `trap "exit 0" TERM; sleep 3600 & wait`

	// A reader of sub_path "dir".
	t0 := time.Now()
	r1, err := e.subPathSandbox(t, "dir", true, idle)
	if err != nil {
		t.Fatalf("read-only GLOBAL mount with a sub_path on the Kubernetes runner: %v", err)
	}
	gwWait(t, e.api, r1, sandboxv1.State_STATE_RUNNING)
	t.Logf("read-only sub_path GLOBAL copy: create to RUNNING in %s", time.Since(t0).Round(time.Millisecond))
	if code, out := exec(r1, "cat /data/hello.txt && ls /data && test ! -e /data/top.txt"); code != 0 || out != "in dir\ndeep\nhello.txt\n" {
		t.Errorf("the reader of sub_path dir: exit %d, %q; want dir's content only", code, out)
	}
	if code, out := exec(r1, "echo x > /data/new.txt"); code == 0 || !strings.Contains(out, "Read-only file system") {
		t.Errorf("write to the read-only sub_path mount: exit %d, %q; want Read-only file system", code, out)
	}
	// A sub_path missing from the volume: an empty directory, as on a local runner.
	r2, err := e.subPathSandbox(t, "missing/deeper", true, idle)
	if err != nil {
		t.Fatal(err)
	}
	gwWait(t, e.api, r2, sandboxv1.State_STATE_RUNNING)
	if code, out := exec(r2, "ls -A /data; stat -c %a /data"); code != 0 || out != "777\n" {
		t.Errorf("a missing sub_path: exit %d, %q; want an empty directory, mode 777", code, out)
	}
	for _, id := range []string{r1, r2} {
		if _, err := e.api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
	}

	// A writer of sub_path "dir": its commit is the whole volume.
	w, err := e.subPathSandbox(t, "dir", false, `cat /data/hello.txt > /data/copied.txt && echo changed >> /data/hello.txt && mkdir /data/made && echo new > /data/made/n.txt`)
	if err != nil {
		t.Fatalf("read-write GLOBAL mount with a sub_path: %v", err)
	}
	gwWait(t, e.api, w, sandboxv1.State_STATE_COMPLETED)
	m2 := e.waitGeneration(t, 2)
	if m2.SandboxID != w {
		t.Errorf("generation 2 by %s, want %s", m2.SandboxID, w)
	}
	got := e.generationFiles(t, m2, "top.txt", "dir/hello.txt", "dir/copied.txt", "dir/made/n.txt", "hello.txt")
	if got["top.txt"] != "at the root\n" || got["dir/hello.txt"] != "in dir\nchanged\n" || got["dir/copied.txt"] != "in dir\n" || got["dir/made/n.txt"] != "new\n" ||
		!strings.HasPrefix(got["hello.txt"], "<") {
		t.Errorf("generation 2: %v; want the whole volume with the writer's change inside dir", got)
	}

	// A second sandbox reads the committed change through its own sub_path mount.
	r3, err := e.subPathSandbox(t, "dir/made", true, `grep -q new /data/n.txt`)
	if err != nil {
		t.Fatal(err)
	}
	gwWait(t, e.api, r3, sandboxv1.State_STATE_COMPLETED)
	r4, err := e.subPathSandbox(t, "dir", true, idle)
	if err != nil {
		t.Fatal(err)
	}
	gwWait(t, e.api, r4, sandboxv1.State_STATE_RUNNING)
	if code, out := exec(r4, "cat /data/hello.txt /data/made/n.txt"); code != 0 || out != "in dir\nchanged\nnew\n" {
		t.Errorf("the reader after the commit: exit %d, %q; want generation 2's dir", code, out)
	}
}

// TestGlobalVolumeSubPathSymlinkAttack: a GLOBAL volume's content is sandbox-written;
// a generation whose archive makes a sub_path a symlink pointing outside the volume (a
// canary directory of the test on this host, the node), or puts a symlink or a file on
// the way to it, never gets that mount: the sandbox fails naming the symlink (or "not a
// directory") and never runs; the kubelet made the sub-directory in the empty copy before
// the fill, and the fill refuses to replace it. The canary is untouched.
func TestGlobalVolumeSubPathSymlinkAttack(t *testing.T) {
	e := newGlobalEnv(t)
	ctx := context.Background()
	canary := t.TempDir()
	if err := os.WriteFile(filepath.Join(canary, "host-secret"), []byte("host only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(canary)
	if err != nil {
		t.Fatal(err)
	}
	e.putGeneration(t, 1, func(root string) error {
		if err := os.Symlink(canary, filepath.Join(root, "escape")); err != nil {
			return err
		}
		if err := os.Symlink("/", filepath.Join(root, "slash")); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(root, "d"), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("../escape", filepath.Join(root, "d", "up")); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(root, "file"), []byte("a file\n"), 0o644)
	})
	for _, c := range []struct {
		sub  string
		ro   bool
		want string
	}{
		{"escape", true, "symlink"},
		{"slash", false, "symlink"},
		{"d/up", true, "symlink"},
		{"d/up/x", true, "symlink"},
		{"file", true, "regular file"},
	} {
		id, err := e.subPathSandbox(t, c.sub, c.ro, `trap "exit 0" TERM; sleep 3600 & wait`)
		if err != nil {
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("sub_path %q: create refused for another reason: %v", c.sub, err)
			}
			continue
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			res, err := e.api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil {
				t.Fatal(err)
			}
			st := res.Msg.GetStatus()
			if st.GetState() == sandboxv1.State_STATE_RUNNING {
				ex, _ := e.api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"ls", "-la", "/data"}}))
				t.Fatalf("sub_path %q through a planted symlink mounted: /data holds %q", c.sub, ex.Msg.GetStdout())
			}
			if st.GetState() == sandboxv1.State_STATE_FAILED {
				if !strings.Contains(st.GetStateReason(), c.want) || !strings.Contains(st.GetStateReason(), "sub_path") {
					t.Errorf("sub_path %q failed for another reason: %s", c.sub, st.GetStateReason())
				} else {
					t.Logf("sub_path %q: %s", c.sub, st.GetStateReason())
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sub_path %q: sandbox %v", c.sub, st)
			}
		}
		if c.ro {
			continue
		}
		// A writer refused at its fill commits nothing: generation 1 stays.
		if m, err := runner.ReadGlobalManifest(ctx, e.blobs, e.prefix); err != nil || m.Generation != 1 {
			t.Errorf("after the refused writer: generation %+v, %v; want 1", m, err)
		}
	}
	after, err := os.Stat(canary)
	if err != nil {
		t.Fatal(err)
	}
	if after.Mode() != before.Mode() || after.ModTime() != before.ModTime() {
		t.Errorf("the host's canary dir changed: %v %v -> %v %v", before.Mode(), before.ModTime(), after.Mode(), after.ModTime())
	}
	if ents, _ := os.ReadDir(canary); len(ents) != 1 {
		t.Errorf("the host's canary dir holds %d entries, want 1 (host-secret)", len(ents))
	}
}

// TestGlobalVolumeWorkingDirBelowMount: runc makes a container's working directory and a
// nested mount point below a GLOBAL mount in the (empty) copy when it creates the
// container; the runner waits for that container and fills those directories in place
// (docs/volumes.md): a writer with working_dir /data/wd/deeper (missing from the volume)
// and a scratch volume nested at /data/dir/scratch runs in that directory, sees the
// generation's content, and its commit holds its file. Below a read-only mount runc
// cannot make them: a reader with working_dir below its mount is refused naming the
// field, never left to fail in the container runtime.
func TestGlobalVolumeWorkingDirBelowMount(t *testing.T) {
	e := newGlobalEnv(t)
	ctx := context.Background()
	e.putGeneration(t, 1, func(root string) error {
		if err := os.MkdirAll(filepath.Join(root, "dir"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(root, "dir", "hello.txt"), []byte("in dir\n"), 0o644)
	})
	create := func(wd string, ro bool, script string) (string, error) {
		res, err := e.api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", script}, WorkingDir: wd,
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: ro}, {Volume: "s", MountPath: "/data/dir/scratch"}}}},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}, {Name: "s"}},
		}}}))
		if err != nil {
			return "", err
		}
		id := res.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = e.api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
		return id, nil
	}
	t0 := time.Now()
	w, err := create("/data/wd/deeper", false, `pwd > out.txt && cat /data/dir/hello.txt >> out.txt && ls -A /data/dir >> out.txt`)
	if err != nil {
		t.Fatalf("a writer with its working_dir below the GLOBAL mount: %v", err)
	}
	gwWait(t, e.api, w, sandboxv1.State_STATE_COMPLETED)
	t.Logf("writer with working_dir and a nested mount below the copy: create to COMPLETED in %s", time.Since(t0).Round(time.Millisecond))
	m2 := e.waitGeneration(t, 2)
	if got := e.generationFiles(t, m2, "wd/deeper/out.txt", "dir/hello.txt"); got["wd/deeper/out.txt"] != "/data/wd/deeper\nin dir\nhello.txt\nscratch\n" || got["dir/hello.txt"] != "in dir\n" {
		t.Errorf("generation 2: %v; want the writer's out.txt in its working directory, dir kept", got)
	}

	// A reader (read-only) with its working_dir below the mount: refused, naming it.
	id, err := create("/data/dir", true, `true`)
	if err != nil {
		if !strings.Contains(err.Error(), "working_dir") || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("reader with working_dir below its read-only mount: refused for another reason: %v", err)
		}
		return
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		res, err := e.api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		st := res.Msg.GetStatus()
		if st.GetState() == sandboxv1.State_STATE_FAILED {
			if !strings.Contains(st.GetStateReason(), "working_dir") || !strings.Contains(st.GetStateReason(), "read-only") {
				t.Errorf("reader with working_dir below its read-only mount failed for another reason: %s", st.GetStateReason())
			}
			return
		}
		if st.GetState() != sandboxv1.State_STATE_CREATING && st.GetState() != sandboxv1.State_STATE_PENDING || time.Now().After(deadline) {
			t.Fatalf("reader with working_dir below its read-only mount: %v, want FAILED naming working_dir", st)
		}
	}
}
