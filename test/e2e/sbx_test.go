package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/sandboxd/sandboxd/internal/dataplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/sbxcli"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// sdkClient is a Go SDK client of the gateway with key.
func sdkClient(t *testing.T, g *gw, key string) *sandbox.Client {
	t.Helper()
	c, err := sandbox.New(g.url, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSDKFlows runs the official client's documented flows through the Go SDK.
func TestSDKFlows(t *testing.T) {
	g := startGateway(t)
	c := sdkClient(t, g, g.keyA)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	sb, err := c.Create(ctx, sandbox.Spec{
		Image: busybox(), Tags: []string{"sdk", "flows"}, Env: map[string]string{"FOO": "bar"},
		Files: map[string][]byte{"/tmp/seed/hello.txt": []byte("seed")}, CPU: "500m", Memory: "256Mi", Lifetime: 10 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID() == "" || sb.State() != sandbox.StateCreating {
		t.Fatalf("create: %q in %s, want an ID in creating", sb.ID(), sb.State())
	}
	if err := sb.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if in := sb.Info(); in.State != sandbox.StateRunning || in.RunnerID != "local" || in.StartedAt.IsZero() || in.ExitCode != nil {
		t.Fatalf("after wait: %+v", in)
	}

	t.Run("exec", func(t *testing.T) {
		var out, errb bytes.Buffer
		code, err := sb.Exec(ctx, []string{"sh", "-c", "cat; echo err >&2; echo $FOO; exit 7"},
			sandbox.ExecOptions{Stdin: strings.NewReader("from stdin\n"), Stdout: &out, Stderr: &errb})
		if err != nil || code != 7 || out.String() != "from stdin\nbar\n" || errb.String() != "err\n" {
			t.Errorf("exec: code %d err %v stdout %q stderr %q", code, err, out.String(), errb.String())
		}
		// Large stdin in many chunks, half-closed at EOF.
		big := randomBytes(t, 3<<20)
		out.Reset()
		code, err = sb.Exec(ctx, []string{"wc", "-c"}, sandbox.ExecOptions{Stdin: bytes.NewReader(big), Stdout: &out})
		if err != nil || code != 0 || strings.TrimSpace(out.String()) != fmt.Sprint(len(big)) {
			t.Errorf("exec wc: code %d err %v stdout %q", code, err, out.String())
		}
		stdout, _, code, err := sb.Run(ctx, []string{"cat", "/tmp/seed/hello.txt"})
		if err != nil || code != 0 || string(stdout) != "seed" {
			t.Errorf("run: %q %d %v", stdout, code, err)
		}
		out.Reset()
		if code, err := sb.Exec(ctx, []string{"pwd"}, sandbox.ExecOptions{Cwd: "/tmp/seed", Stdout: &out}); err != nil || code != 0 || out.String() != "/tmp/seed\n" {
			t.Errorf("cwd: %q %d %v", out.String(), code, err)
		}
		out.Reset()
		code, err = sb.Exec(ctx, []string{"sh", "-c", "tty; stty size"}, sandbox.ExecOptions{TTY: true, Width: 100, Height: 30, Stdout: &out})
		if err != nil || code != 0 || !strings.Contains(out.String(), "/dev/") || !strings.Contains(out.String(), "30 100") {
			t.Errorf("tty: %q %d %v", out.String(), code, err)
		}
	})

	t.Run("files", func(t *testing.T) {
		for _, size := range []int{1 << 10, 10 << 20, 40 << 20} { // 40 MiB goes through the streaming fallback
			data := randomBytes(t, size)
			path := fmt.Sprintf("/tmp/files/%d/data.bin", size)
			if err := sb.WriteFile(ctx, path, data); err != nil {
				t.Fatalf("write %d bytes: %v", size, err)
			}
			got, err := sb.ReadFile(ctx, path)
			if err != nil {
				t.Fatalf("read %d bytes: %v", size, err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes back, wrote %d (different content)", len(got), size)
			}
		}
		_, err := sb.ReadFile(ctx, "/no/such/file")
		var e *sandbox.Error
		if !errors.Is(err, sandbox.ErrFileNotFound) || !errors.As(err, &e) || e.Metadata["filepath"] != "/no/such/file" || errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("missing file: %v", err)
		}
	})

	t.Run("logs", func(t *testing.T) {
		chatty, err := c.Create(ctx, sandbox.Spec{Image: busybox(), Tags: []string{"sdk", "logs"}, Command: "/bin/sh",
			Args: []string{"-c", `trap "exit 0" TERM; echo one; sleep 0.1; echo two >&2; sleep 0.1; echo three; sleep infinity & wait`}})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		for deadline := time.Now().Add(20 * time.Second); ; {
			out.Reset()
			if err := chatty.Logs(ctx, sandbox.LogOptions{}, &out); err != nil {
				t.Fatal(err)
			}
			if strings.Count(out.String(), "\n") >= 3 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if out.String() != "one\ntwo\nthree\n" {
			t.Errorf("logs %q", out.String())
		}
		out.Reset()
		if err := chatty.Logs(ctx, sandbox.LogOptions{Tail: 1, Timestamps: true}, &out); err != nil || !strings.HasSuffix(out.String(), " three\n") || !strings.HasPrefix(out.String(), "20") {
			t.Errorf("tail 1 with timestamps: %q %v", out.String(), err)
		}
		// Follow streams until the main command ends.
		fctx, fcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		var followed bytes.Buffer
		go func() { done <- chatty.Logs(fctx, sandbox.LogOptions{Follow: true}, &followed) }()
		time.Sleep(300 * time.Millisecond)
		if err := chatty.Stop(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("follow: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("follow did not end with the sandbox")
		}
		fcancel()
		if !strings.HasPrefix(followed.String(), "one\n") {
			t.Errorf("followed %q", followed.String())
		}
	})

	t.Run("list", func(t *testing.T) {
		list, err := c.List(ctx, sandbox.ListOptions{Tags: []string{"sdk", "flows"}})
		if err != nil || len(list) != 1 || list[0].ID() != sb.ID() || list[0].State() != sandbox.StateRunning {
			t.Errorf("list by tag: %d (%v)", len(list), err)
		}
		// Small pages are followed.
		more := []*sandbox.Sandbox{}
		for range 3 {
			s, err := c.Create(ctx, sandbox.Spec{Image: busybox(), Tags: []string{"paged"}})
			if err != nil {
				t.Fatal(err)
			}
			more = append(more, s)
		}
		list, err = c.List(ctx, sandbox.ListOptions{Tags: []string{"paged"}, PageSize: 1})
		if err != nil || len(list) != 3 {
			t.Errorf("paged list: %d (%v)", len(list), err)
		}
		for _, s := range more {
			if err := c.Delete(ctx, s.ID()); err != nil {
				t.Error(err)
			}
		}
		if list, err := c.List(ctx, sandbox.ListOptions{Tags: []string{"nope"}}); err != nil || len(list) != 0 {
			t.Errorf("list by unknown tag: %d (%v)", len(list), err)
		}
	})

	t.Run("stop and errors", func(t *testing.T) {
		if err := sb.Stop(ctx, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if sb.State() != sandbox.StateTerminated {
			t.Errorf("after stop: %s", sb.State())
		}
		got, err := c.Get(ctx, sb.ID())
		if err != nil || got.State() != sandbox.StateTerminated || got.Info().EndedAt.IsZero() {
			t.Errorf("get after stop: %v", err)
		}
		if list, err := c.List(ctx, sandbox.ListOptions{Tags: []string{"flows"}}); err != nil || len(list) != 0 {
			t.Errorf("default list shows a stopped sandbox: %d (%v)", len(list), err)
		}
		if list, err := c.List(ctx, sandbox.ListOptions{Tags: []string{"flows"}, ShowTerminated: true}); err != nil || len(list) != 1 {
			t.Errorf("list with terminated: %d (%v)", len(list), err)
		}
		if _, _, _, err := sb.Run(ctx, []string{"true"}); !errors.Is(err, sandbox.ErrSandboxTerminated) && !errors.Is(err, sandbox.ErrNotRunning) {
			t.Errorf("exec on a stopped sandbox: %v", err)
		}
		if err := c.Delete(ctx, sb.ID()); err != nil {
			t.Errorf("delete a stopped sandbox: %v", err)
		}

		_, err = c.Get(ctx, "sbx-no-such-sandbox")
		if !errors.Is(err, sandbox.ErrNotFound) || sandbox.ReasonOf(err) != sandbox.ReasonSandboxNotFound {
			t.Errorf("unknown sandbox: %v", err)
		}
		if err := c.Delete(ctx, "sbx-no-such-sandbox"); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("delete unknown: %v", err)
		}
		if _, err := sdkClient(t, g, g.keyB).Get(ctx, sb.ID()); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("another organization's sandbox: %v", err)
		}
		_, err = sdkClient(t, g, "sbx_wrong_key").List(ctx, sandbox.ListOptions{})
		var e *sandbox.Error
		if !errors.Is(err, sandbox.ErrUnauthenticated) || !errors.As(err, &e) || e.Reason != sandbox.ReasonUnauthenticated {
			t.Errorf("wrong key: %v", err)
		}
	})

	t.Run("failed start", func(t *testing.T) {
		bad, err := c.Create(ctx, sandbox.Spec{Image: strings.Replace(busybox(), "busybox", "no-such-image", 1)})
		if err != nil {
			t.Fatal(err)
		}
		err = bad.Wait(ctx)
		var se *sandbox.StateError
		if !errors.Is(err, sandbox.ErrSandboxFailed) || !errors.As(err, &se) || se.Reason == "" {
			t.Errorf("wait on an unknown image: %v", err)
		}
	})
}

// sbx runs the CLI in-process against g with key A.
func sbx(g *gw, stdin string, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = sbxcli.Execute(append([]string{"--base-url", g.url, "--api-key", g.keyA}, args...), strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

func TestSbxCLI(t *testing.T) {
	g := startGateway(t)
	img := busybox()

	out, errs, code := sbx(g, "", "run", "-q", "--rm", img, "--", "sh", "-c", "echo hi; echo oops >&2; exit 3")
	if out != "hi\n" || errs != "oops\n" || code != 3 {
		t.Errorf("run: stdout %q stderr %q exit %d, want hi/oops/3", out, errs, code)
	}
	if list, _ := sdkClient(t, g, g.keyA).List(context.Background(), sandbox.ListOptions{}); len(list) != 0 {
		t.Errorf("run --rm left %d sandboxes", len(list))
	}

	out, errs, code = sbx(g, "", "run", "--tag", "cli", "--env", "GREETING=hello", img)
	id := strings.TrimSpace(out)
	if code != 0 || id == "" || strings.Contains(id, "\n") {
		t.Fatalf("run without a command: %q %q %d", out, errs, code)
	}

	out, errs, code = sbx(g, "", "ls", "--tag", "cli", "-o", "json")
	var list []struct {
		SandboxID string `json:"sandboxId"`
		Status    struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 || len(list) != 1 || list[0].SandboxID != id || list[0].Status.State != "STATE_RUNNING" {
		t.Errorf("ls -o json: %v %q %q %d", err, out, errs, code)
	}
	if out, _, code := sbx(g, "", "ls"); code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "running") {
		t.Errorf("ls: %q %d", out, code)
	}
	var got map[string]any
	if out, _, code := sbx(g, "", "get", id, "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &got) != nil || got["sandboxId"] != id {
		t.Errorf("get -o json: %q %d", out, code)
	}
	if out, _, code := sbx(g, "", "get", id); code != 0 || !strings.Contains(out, "running") || !strings.Contains(out, "Egress:") ||
		!strings.Contains(out, "any; tenant=same_org") {
		t.Errorf("get (the platform default egress): %q %d", out, code)
	}
	out, errs, code = sbx(g, "", "run", "--egress", "dns=pypi.org", "--egress", "cidr=203.0.113.0/24", img)
	netID := strings.TrimSpace(out)
	if code != 0 {
		t.Errorf("run --egress: %q %q %d", out, errs, code)
	} else if out, _, code := sbx(g, "", "get", netID); code != 0 || !strings.Contains(out, "dns=pypi.org; cidr=203.0.113.0/24") {
		t.Errorf("get (explicit egress): %q %d", out, code)
	}
	out, errs, code = sbx(g, "", "run", "--deny-egress", img)
	denyID := strings.TrimSpace(out)
	if code != 0 {
		t.Errorf("run --deny-egress: %q %q %d", out, errs, code)
	} else if out, _, code := sbx(g, "", "get", denyID); code != 0 || !strings.Contains(out, "none (only the platform DNS)") {
		t.Errorf("get (deny-egress): %q %d", out, code)
	}
	if _, errs, code := sbx(g, "", "run", "--egress", "cidr=10.1.2.3/8", img); code != 1 || !strings.Contains(errs, "sandbox.spec.network.egress[0].cidr") {
		t.Errorf("run with a bad CIDR: %q %d", errs, code)
	}

	if out, errs, code := sbx(g, "piped input\n", "exec", id, "--", "sh", "-c", "cat; echo $GREETING; exit 5"); out != "piped input\nhello\n" || code != 5 {
		t.Errorf("exec with stdin: %q %q %d", out, errs, code)
	}

	if _, errs, code := sbx(g, "file content\n", "files", "write", id, "/tmp/cli/f.txt"); code != 0 {
		t.Errorf("files write: %q %d", errs, code)
	}
	if out, errs, code := sbx(g, "", "files", "read", id, "/tmp/cli/f.txt"); out != "file content\n" || code != 0 {
		t.Errorf("files read: %q %q %d", out, errs, code)
	}
	if _, errs, code := sbx(g, "", "files", "read", id, "/tmp/cli/missing"); code != 1 || !strings.Contains(errs, "(CWSANDBOX_FILE_NOT_FOUND)") {
		t.Errorf("files read missing: %q %d", errs, code)
	}

	// logs: a sandbox whose main command prints.
	chatty, err := sdkClient(t, g, g.keyA).Create(context.Background(), sandbox.Spec{Image: img, Command: "/bin/sh",
		Args: []string{"-c", `trap "exit 0" TERM; echo first; echo second; sleep infinity & wait`}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, errs, code = sbx(g, "", "logs", chatty.ID())
		if out == "first\nsecond\n" || time.Now().After(deadline) {
			break
		}
	}
	if out != "first\nsecond\n" || code != 0 {
		t.Errorf("logs: %q %q %d", out, errs, code)
	}
	if out, _, code := sbx(g, "", "logs", chatty.ID(), "--tail", "1", "--timestamps"); code != 0 || !strings.HasSuffix(out, " second\n") || strings.Contains(out, "first") {
		t.Errorf("logs --tail 1 --timestamps: %q %d", out, code)
	}

	if out, errs, code := sbx(g, "", "stop", id, "--grace", "1s"); code != 0 || out != id+" terminated\n" {
		t.Errorf("stop: %q %q %d", out, errs, code)
	}
	if _, _, code := sbx(g, "", "delete", chatty.ID()); code != 0 {
		t.Errorf("delete: %d", code)
	}
	if _, errs, code := sbx(g, "", "get", "sbx-no-such"); code != 1 || !strings.HasPrefix(errs, "sbx: ") || !strings.Contains(errs, "(CWSANDBOX_SANDBOX_NOT_FOUND)") {
		t.Errorf("get unknown: %q %d", errs, code)
	}
	if _, _, code := sbx(g, "", "delete", "--missing-ok", "sbx-no-such"); code != 0 {
		t.Errorf("delete --missing-ok: %d", code)
	}
	var errb bytes.Buffer
	if code := sbxcli.Execute([]string{"--base-url", g.url, "--api-key", "sbx_wrong", "ls"}, nil, &bytes.Buffer{}, &errb); code != 1 || !strings.Contains(errb.String(), "(CWSANDBOX_UNAUTHENTICATED)") {
		t.Errorf("wrong key: %q %d", errb.String(), code)
	}
}

// signalWriter passes writes on and closes seen once the output contains want.
type signalWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := strings.Contains(w.buf.String(), w.want)
	w.buf.Write(p)
	if !before && strings.Contains(w.buf.String(), w.want) {
		close(w.seen)
	}
	return len(p), nil
}

// TestSbxCLIDayOne: what a first-day user of sbx meets, against a real runner: exit
// codes (127, 130 on Ctrl-C ending the command), purge, get in human units, run's
// "keeps running until", files ls/mkdir/rm and directory copies both ways, sh picking
// bash.
func TestSbxCLIDayOne(t *testing.T) {
	g := startGateway(t)
	img := busybox()

	out, errs, code := sbx(g, "", "run", "-q", "--tag", "dayone", "--cpu", "500m", "--memory", "256Mi", "--lifetime", "20m", img)
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("run: %q %q %d", out, errs, code)
	}
	if want := "sbx: sandbox " + id + " keeps running until "; !strings.HasPrefix(errs, want) || !strings.HasSuffix(errs, " (stop it with: sbx stop "+id+")\n") {
		t.Errorf("run stderr %q, want %q… (stop it with: sbx stop %s)", errs, want, id)
	}
	out, _, code = sbx(g, "", "get", id)
	for _, re := range []string{`(?m)^CPU:\s+500m CPU$`, `(?m)^Memory:\s+256 MiB$`, `(?m)^Restarts:\s+0$`, `(?m)^Lifetime:\s+20m$`, `(?m)^Expires:\s+\S+ \S+ \S+ \(in 19m[0-9]+s\)$`} {
		if code != 0 || !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get: no %s in\n%s", re, out)
		}
	}

	// Exit codes.
	if _, errs, code := sbx(g, "", "exec", id, "--", "no-such-command"); code != 127 || !strings.Contains(errs, "no-such-command") {
		t.Errorf("exec of a missing command: %d %q", code, errs)
	}
	if _, errs, code := sbx(g, "", "exec", id, "--", "/etc/passwd"); code != 126 {
		t.Errorf("exec of a file that is no program: %d %q", code, errs)
	}
	w := &signalWriter{want: "started", seen: make(chan struct{})}
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		select {
		case <-w.seen:
			cancel(sbxcli.Interrupted{Signal: syscall.SIGINT})
		case <-time.After(30 * time.Second):
			cancel(errors.New("no output"))
		}
	}()
	var errb bytes.Buffer
	code = sbxcli.ExecuteContext(ctx, []string{"--base-url", g.url, "--api-key", g.keyA, "exec", id, "--", "sh", "-c", "echo $$ > /tmp/pid; echo started; exec sleep 120"},
		strings.NewReader(""), w, &errb)
	if code != 130 || !strings.Contains(errb.String(), "sbx: interrupted") {
		t.Errorf("exec, Ctrl-C: exit %d, stderr %q", code, errb.String())
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, _, code := sbx(g, "", "exec", id, "--", "sh", "-c", "kill -0 $(cat /tmp/pid)"); code != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Error("the interrupted command still runs in the sandbox")
			break
		}
	}

	// Files: mkdir, a tree copied in and out, ls, rm.
	src := t.TempDir()
	for p, c := range map[string]string{"tree/a.txt": "alpha", "tree/sub/b": "beta", "tree/sub/deep/c": "gamma"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/b", filepath.Join(src, "tree/link")); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := sbx(g, "", "files", "mkdir", "-p", id, "/work/in"); code != 0 {
		t.Errorf("files mkdir: %q %d", errs, code)
	}
	if _, errs, code := sbx(g, "", "cp", filepath.Join(src, "tree"), id+":/work/in"); code != 0 {
		t.Errorf("cp up: %q %d", errs, code)
	}
	if out, errs, code := sbx(g, "", "exec", id, "--", "sh", "-c", "cat /work/in/tree/sub/deep/c /work/in/tree/link; readlink /work/in/tree/link"); out != "gammabetasub/b\n" || code != 0 {
		t.Errorf("after cp up: %q %q %d", out, errs, code)
	}
	if out, errs, code := sbx(g, "", "files", "ls", id, "/work/in/tree"); code != 0 || !strings.Contains(out, "a.txt") || !strings.Contains(out, "link -> sub/b") {
		t.Errorf("files ls: %q %q %d", out, errs, code)
	}
	dst := filepath.Join(t.TempDir(), "back")
	if _, errs, code := sbx(g, "", "files", "cp", id+":/work/in/tree", dst); code != 0 {
		t.Errorf("cp down: %q %d", errs, code)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "sub/deep/c")); err != nil || string(b) != "gamma" {
		t.Errorf("after cp down: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "sub/b" {
		t.Errorf("link after cp down: %q %v", l, err)
	}
	if _, errs, code := sbx(g, "", "files", "rm", "-r", id, "/work/in"); code != 0 {
		t.Errorf("files rm -r: %q %d", errs, code)
	}
	if _, _, code := sbx(g, "", "files", "ls", id, "/work/in"); code == 0 {
		t.Error("files ls after rm -r succeeded")
	}

	// sh: bash where the image has it.
	if out, errs, code := sbx(g, "echo shell=${BASH_VERSION:-none}\n", "sh", id); code != 0 || out != "shell=none\n" {
		t.Errorf("sh on busybox: %q %q %d", out, errs, code)
	}
	out, errs, code = sbx(g, "", "run", "--tag", "dayone", python())
	pyID := strings.TrimSpace(out)
	if code != 0 {
		t.Fatalf("run python: %q %d", errs, code)
	}
	if out, errs, code := sbx(g, "echo shell=${BASH_VERSION:-none}\n", "sh", pyID); code != 0 || !strings.HasPrefix(out, "shell=5.") {
		t.Errorf("sh on Debian: %q %q %d", out, errs, code)
	}

	// purge: a dry run names them and stops nothing; then they stop.
	out, errs, code = sbx(g, "", "purge", "--tag", "dayone", "--dry-run")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || lines[0] != "would stop 2 sandboxes" || !slices.Contains(lines, id) || !slices.Contains(lines, pyID) {
		t.Errorf("purge --dry-run: %q %q %d", out, errs, code)
	}
	if list, _ := sdkClient(t, g, g.keyA).List(context.Background(), sandbox.ListOptions{Tags: []string{"dayone"}}); len(list) != 2 {
		t.Errorf("a dry run stopped sandboxes: %d left", len(list))
	}
	if out, errs, code := sbx(g, "", "purge", "--tag", "dayone"); code != 0 || out != "stopped 2 sandboxes\n" {
		t.Errorf("purge: %q %q %d", out, errs, code)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		list, err := sdkClient(t, g, g.keyA).List(context.Background(), sandbox.ListOptions{Tags: []string{"dayone"}})
		if err == nil && len(list) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after purge: %d sandboxes, %v", len(list), err)
		}
	}
}

// TestSbxShell drives `sbx sh` through a pseudo-terminal: raw mode, the initial window
// size, a resize on SIGWINCH, and the shell's exit code.
func TestSbxShell(t *testing.T) {
	g := startGateway(t)
	sb, err := sdkClient(t, g, g.keyA).Create(context.Background(), sandbox.Spec{Image: busybox()})
	if err != nil {
		t.Fatal(err)
	}
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var screen bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			mu.Lock()
			screen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	waitFor := func(s string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			mu.Lock()
			ok := strings.Contains(screen.String(), s)
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("no %q on the terminal:\n%q", s, screen.String())
			}
		}
	}
	done := make(chan int, 1)
	go func() {
		done <- sbxcli.Execute([]string{"--base-url", g.url, "--api-key", g.keyA, "sh", sb.ID()}, tty, tty, tty)
	}()
	_, _ = ptmx.Write([]byte("echo size=$(stty size) sum=$((6*7))\n"))
	waitFor("size=40 120 sum=42")
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 50, Cols: 150}); err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGWINCH)
	time.Sleep(300 * time.Millisecond)
	_, _ = ptmx.Write([]byte("echo resized=$(stty size)\n"))
	waitFor("resized=50 150")
	_, _ = ptmx.Write([]byte("exit 4\n"))
	select {
	case code := <-done:
		if code != 4 {
			t.Errorf("sbx sh exited %d, want 4", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sbx sh did not end after exit")
	}
}

// startGatewayWithDataPlane is startGateway whose runner also serves the direct data
// plane, as `sandboxd dev --data-plane-listen` does; dp counts the calls it serves.
func startGatewayWithDataPlane(t *testing.T) (g *gw, dp *dataplane.Listener) {
	t.Helper()
	dpCA, err := dataplane.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g = startGateway(t, func(c *gateway.Config) {
		local := c.Runners[0].(*runner.Local)
		l, uri, err := dataplane.Start(dataplane.ListenConfig{Listen: "127.0.0.1:0", CA: dpCA, Sandboxes: local})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		dp, local.DataPlaneURI = l, uri
		c.DataPlane = &dataplane.Issuer{CA: dpCA}
	})
	return g, dp
}

// TestSDKDataPlaneModes: the Go SDK goes direct to the runner's data plane in AUTO and
// DIRECT mode (the data plane counts the calls), never in GATEWAY mode; with the data
// plane gone, AUTO falls back to the gateway and DIRECT fails saying why.
func TestSDKDataPlaneModes(t *testing.T) {
	g, dp := startGatewayWithDataPlane(t)
	ctx := context.Background()
	client := func(mode sandbox.DataPlaneMode) *sandbox.Client {
		c, err := sandbox.New(g.url, g.keyA, sandbox.WithDataPlane(mode))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	sb, err := client(sandbox.DataPlaneGateway).Create(ctx, sandbox.Spec{Image: busybox()})
	if err != nil {
		t.Fatal(err)
	}
	use := func(mode sandbox.DataPlaneMode) (int64, error) {
		h := client(mode).Sandbox(sb.ID())
		before := dp.Server.Calls()
		var out bytes.Buffer
		if code, err := h.Exec(ctx, []string{"echo", string(mode)}, sandbox.ExecOptions{Stdout: &out}); err != nil || code != 0 || out.String() != string(mode)+"\n" {
			return 0, fmt.Errorf("exec: %d %q %w", code, out.String(), err)
		}
		if err := h.WriteFile(ctx, "/tmp/m", []byte(mode)); err != nil {
			return 0, err
		}
		if b, err := h.ReadFile(ctx, "/tmp/m"); err != nil || string(b) != string(mode) {
			return 0, fmt.Errorf("read back %q %w", b, err)
		}
		return dp.Server.Calls() - before, nil
	}
	for _, tc := range []struct {
		mode   sandbox.DataPlaneMode
		direct bool
	}{{sandbox.DataPlaneGateway, false}, {sandbox.DataPlaneAuto, true}, {sandbox.DataPlaneDirect, true}} {
		n, err := use(tc.mode)
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		if (n >= 3) != tc.direct || (!tc.direct && n != 0) {
			t.Errorf("%s: %d direct calls", tc.mode, n)
		}
	}
	// The data plane goes away: AUTO still works (through the gateway), DIRECT says why not.
	dp.Close()
	if n, err := use(sandbox.DataPlaneAuto); err != nil || n != 0 {
		t.Errorf("auto without a data plane: %d direct calls, %v", n, err)
	}
	if _, err := use(sandbox.DataPlaneDirect); err == nil || !strings.Contains(err.Error(), "direct data plane") {
		t.Errorf("direct without a data plane: %v", err)
	}
	// sbx: the same modes by flag; GATEWAY works without the data plane.
	if out, errs, code := sbx(g, "", "--data-plane", "gateway", "exec", sb.ID(), "--", "echo", "ok"); code != 0 || out != "ok\n" {
		t.Errorf("sbx --data-plane gateway exec: %d %q %s", code, out, errs)
	}
	if _, errs, code := sbx(g, "", "--data-plane", "sideways", "ls"); code == 0 || !strings.Contains(errs, "--data-plane") {
		t.Errorf("sbx --data-plane sideways: %d %s", code, errs)
	}
}
