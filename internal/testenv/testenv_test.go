package testenv

import (
	"bytes"
	"debug/elf"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes the test binary a child of TestRequireRootRule: it runs
// TestRequireRootChild, which reports what the helpers decided.
const childEnv = "SANDBOXD_TESTENV_CHILD"

func TestRequireRootChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestRequireRootRule")
	}
	code, ok := MainRequiresRoot("pkg", "child")
	fmt.Printf("main: code=%d ok=%v\n", code, ok)
	RequireRoot(t, "child")
	fmt.Println("ran")
}

// TestRequireRootRule: without root a test that needs it skips, and fails where CI
// requires root; with -short it skips even as root; as root it runs. MainRequiresRoot
// decides the same for a whole package.
func TestRequireRootRule(t *testing.T) {
	// A copy of this test binary that nobody (the non-root cases, when we are root) can run.
	dir, err := os.MkdirTemp("", "testenv-") // not t.TempDir(): its parent is 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "testenv.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	cases := []struct {
		name    string
		root    bool
		short   bool
		env     []string
		outcome string // PASS, SKIP or FAIL, and the output's telling part
		want    string
		main    string
	}{
		{name: "not root", outcome: "SKIP", want: "needs root (child): running as uid", main: "code=0 ok=false"},
		{name: "not root, required", env: []string{RequireRootEnv + "=1"}, outcome: "FAIL", want: "SANDBOXD_REQUIRE_ROOT=1 or CI=true require it", main: "code=1 ok=false"},
		{name: "not root, CI", env: []string{"CI=true"}, outcome: "FAIL", want: "needs root (child): running as uid", main: "code=1 ok=false"},
		{name: "not root, -short, required", short: true, env: []string{RequireRootEnv + "=1"}, outcome: "SKIP", want: "-short runs the unit tier", main: "code=0 ok=false"},
		{name: "root, -short", root: true, short: true, env: []string{"CI=true"}, outcome: "SKIP", want: "-short runs the unit tier", main: "code=0 ok=false"},
		{name: "root", root: true, env: []string{"CI=true"}, outcome: "PASS", want: "ran", main: "code=0 ok=true"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.root && !root {
				t.Skip("the root cases need root")
			}
			args := []string{"-test.run=^TestRequireRootChild$", "-test.v"}
			if c.short {
				args = append(args, "-test.short")
			}
			cmd := exec.Command(bin, args...)
			cmd.Dir = dir
			cmd.Env = append(cleanEnv(), append(c.env, childEnv+"=1")...)
			if root && !c.root {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			}
			out, err := cmd.CombinedOutput()
			s := string(out)
			if err != nil && !strings.Contains(s, "--- FAIL") {
				t.Fatalf("child: %v\n%s", err, s)
			}
			if !strings.Contains(s, "--- "+c.outcome+": TestRequireRootChild") || !strings.Contains(s, c.want) || !strings.Contains(s, "main: "+c.main+"\n") {
				t.Errorf("want %s with %q and main %q; got:\n%s", c.outcome, c.want, c.main, s)
			}
		})
	}
}

// cleanEnv is the environment without the variables the cases set.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, RequireRootEnv+"=") && !strings.HasPrefix(kv, "CI=") {
			env = append(env, kv)
		}
	}
	return env
}

// TestAgent: the agent is static, stripped and built with -trimpath (as `make agent`
// builds it), executable by everyone, and built once: a second caller gets the same file.
func TestAgent(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	pa, err := Agent(a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := Agent(b)
	if err != nil {
		t.Fatal(err)
	}
	if pa != filepath.Join(a, "sandbox-agent") || pb != filepath.Join(b, "sandbox-agent") {
		t.Fatalf("paths %s, %s", pa, pb)
	}
	fa, err := os.Stat(pa)
	if err != nil {
		t.Fatal(err)
	}
	fb, _ := os.Stat(pb)
	if fa.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fa.Mode())
	}
	if !os.SameFile(fa, fb) {
		t.Errorf("two callers got two builds, want hard links to one")
	}
	f, err := elf.Open(pa)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("dynamically linked (program header %v): want CGO_ENABLED=0", p.Type)
		}
	}
	if f.Section(".symtab") != nil {
		t.Error("has a symbol table: want -ldflags=-s -w")
	}
	data, _ := os.ReadFile(pa)
	if wd, _ := os.Getwd(); bytes.Contains(data, []byte(filepath.Dir(filepath.Dir(wd)))) {
		t.Errorf("contains the checkout's path %s: want -trimpath", filepath.Dir(filepath.Dir(wd)))
	}
	// Cached by content: asking again (as another process would) rebuilds nothing.
	before := fa.ModTime()
	again, err := cachedAgent()
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(again); err != nil || !os.SameFile(fi, fa) || !fi.ModTime().Equal(before) {
		t.Errorf("second lookup: %v, %v: want the cached file unchanged", again, err)
	}
}

// TestAgentCacheDirOwned: tests run the cached agent as root, so a cache dir others could
// have planted or can write to is refused.
func TestAgentCacheDirOwned(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	root, err := agentCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(root); fi.Mode().Perm() != 0o755 {
		t.Errorf("cache dir mode %v, want 0755", fi.Mode())
	}
	if err := os.Chmod(root, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := agentCacheDir(); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("world-writable cache dir: err %v, want refused", err)
	}
	if err := os.Remove(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tmp, root); err != nil {
		t.Fatal(err)
	}
	if _, err := agentCacheDir(); err == nil {
		t.Error("symlinked cache dir accepted")
	}
}

// TestPruneAgents: entries nobody asked for in agentCacheIdle go; recent ones and the one
// just built stay.
func TestPruneAgents(t *testing.T) {
	root := t.TempDir()
	old := time.Now().Add(-2 * agentCacheIdle)
	for _, name := range []string{"stale", "keep", "recent", ".build-crashed"} {
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if name != "recent" {
			if err := os.Chtimes(filepath.Join(root, name), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	pruneAgents(root, "keep")
	ents, _ := os.ReadDir(root)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if strings.Join(left, " ") != "keep recent" {
		t.Errorf("left %v, want [keep recent]", left)
	}
}

// TestFreeAddr: addresses handed out are loopback, free when returned, and never
// handed out twice.
func TestFreeAddr(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		a, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
	}
	a, _ := FreeAddr()
	l, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("listen on the free %s: %v", a, err)
	}
	l.Close()
}
