package local

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestSeccompKey: the cache key names the profile and the runtime binary that compiles
// it: equal for equal profiles, different when either differs.
func TestSeccompKey(t *testing.T) {
	a, err := seccompFor(defaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	b, err := seccompFor(defaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	c, err := seccompFor(append(slices.Clone(defaultCaps), "CAP_SYS_ADMIN"))
	if err != nil {
		t.Fatal(err)
	}
	ka, _ := seccompKey("/usr/sbin/runc", a)
	kb, _ := seccompKey("/usr/sbin/runc", b)
	kc, _ := seccompKey("/usr/sbin/runc", c)
	kd, _ := seccompKey("/opt/runc", a)
	if ka != kb {
		t.Errorf("equal profiles: keys %s and %s", ka, kb)
	}
	if ka == kc || ka == kd {
		t.Errorf("different profile or binary, same key %s", ka)
	}
	p := specParams{Seccomp: a, SeccompProgram: "/x", SeccompSHA256: strings.Repeat("ab", 32)}
	if !agentFilter(p) {
		t.Error("default spec: the agent does not install the filter")
	}
	for name, q := range map[string]specParams{
		"gvisor":               {Seccomp: a, SeccompProgram: "/x", GVisor: true},
		"privilege escalation": {Seccomp: a, SeccompProgram: "/x", Security: &runtime.Security{AllowPrivilegeEscalation: true}},
		"engine":               {Seccomp: a, SeccompProgram: "/x", Engine: "/e"},
		"no profile":           {SeccompProgram: "/x"},
		"volumes":              {Seccomp: a, SeccompProgram: "/x", Volumes: []specs.Mount{{Destination: "/data", Source: "/v", Type: "bind"}}},
	} {
		if agentFilter(q) {
			t.Errorf("%s: the agent would install the filter", name)
		}
	}
	oci := ociSpec(p)
	if oci.Linux.Seccomp != nil || !slices.Contains(oci.Process.Args, "--seccomp-filter="+agentconfig.SeccompPath) ||
		!slices.Contains(oci.Process.Args, "--seccomp-filter-sha256="+p.SeccompSHA256) || !oci.Process.NoNewPrivileges {
		t.Errorf("agent-installed filter: seccomp %v, args %q, no_new_privs %v", oci.Linux.Seccomp != nil, oci.Process.Args, oci.Process.NoNewPrivileges)
	}
}

// TestSeccompCached: the first sandbox of a profile has runc compile its filter, which
// is then read back; the second gets a config.json without linux.seccomp and its agent
// installs that program: pid 1 and its commands run under one filter (Seccomp: 2),
// which refuses what the profile refuses.
func TestSeccompCached(t *testing.T) {
	e := newEnv(t)
	for i, id := range []string{"scc-first", "scc-second"} {
		e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
		defer func() { _ = e.b.Destroy(context.Background(), id) }()
		raw, err := os.ReadFile(filepath.Join(e.b.dir(id), dirBundle, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var oci specs.Spec
		if err := json.Unmarshal(raw, &oci); err != nil {
			t.Fatal(err)
		}
		cached := slices.Contains(oci.Process.Args, "--seccomp-filter="+agentconfig.SeccompPath)
		if cached != (i == 1) || (oci.Linux.Seccomp == nil) != cached {
			t.Fatalf("%s: agent-installed filter %v, OCI profile %v", id, cached, oci.Linux.Seccomp != nil)
		}
		c := agentClient(e.b, id)
		for _, ch := range []struct {
			argv []string
			want string
		}{
			{[]string{"sh", "-c", "grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs):' /proc/1/status | tr -s '\\t' ' '"}, "NoNewPrivs: 1\nSeccomp: 2\nSeccomp_filters: 1"},
			{[]string{"sh", "-c", "grep ^Seccomp: /proc/self/status | tr -s '\\t' ' '"}, "Seccomp: 2"},
			{[]string{"sh", "-c", "unshare -U true 2>&1; echo rc=$?"}, "unshare: unshare(0x10000000): Operation not permitted\nrc=1"},
		} {
			out, errOut, code := execIn(t, c, ch.argv...)
			if strings.TrimSpace(out) != ch.want {
				t.Errorf("%s: %q: %q (stderr %q, exit %d), want %q", id, ch.argv, out, errOut, code, ch.want)
			}
		}
		if i == 1 { // the program the agent installed (it serves: it has) is the one runc compiled, byte for byte
			pid, err := readPid(filepath.Join(e.b.dir(id), filePid))
			if err != nil {
				t.Fatal(err)
			}
			got, err := seccompFilterOf(pid, captureStopLimit)
			if err != nil {
				t.Fatal(err)
			}
			files, _ := filepath.Glob(filepath.Join(e.b.cfg.StateDir, seccompDir, "*.bpf"))
			if len(files) != 1 {
				t.Fatalf("programs kept: %q, want one", files)
			}
			want, err := os.ReadFile(files[0])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the agent's filter (%d bytes) is not the program runc compiled (%d bytes)", len(got), len(want))
			}
		}
	}
}

// TestSeccompProgramBad: an agent handed a program it cannot install exits at once
// (failing the sandbox) rather than run without a filter: neither pid 1 nor anything
// after it runs unfiltered.
func TestSeccompProgramBad(t *testing.T) {
	e := newEnv(t)
	e.create(runtime.Spec{ID: "scb-first", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	defer func() { _ = e.b.Destroy(context.Background(), "scb-first") }()
	files, _ := filepath.Glob(filepath.Join(e.b.cfg.StateDir, seccompDir, "*.bpf"))
	if len(files) != 1 {
		t.Fatalf("programs kept: %q, want one", files)
	}
	// A program the kernel refuses: one instruction, "return" of an unknown class.
	if err := os.Chmod(files[0], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files[0], []byte{0xff, 0xff, 0, 0, 0, 0, 0, 0}, 0o444); err != nil {
		t.Fatal(err)
	}
	id := "scb-second"
	_, err := e.b.Create(context.Background(), &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"3600"}}})
	defer func() { _ = e.b.Destroy(context.Background(), id) }()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := agentClient(e.b, id).Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}})); err == nil {
			t.Fatal("a sandbox whose agent could not install its filter serves")
		}
	}
	out, _ := os.ReadFile(filepath.Join(e.b.dir(id), fileAgentOut))
	if !strings.Contains(string(out), "seccomp filter") {
		t.Errorf("agent output: %q, want the seccomp filter's error", out)
	}
}
