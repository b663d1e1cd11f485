package security

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// TestSeccompCompiledOnce: after the first sandbox of a profile, runc no longer compiles
// the seccomp profile: the filter it compiled for that sandbox is kept
// (<data>/…/.seccomp/*.bpf) and later sandboxes' agents install it themselves, with no
// linux.seccomp in their config.json. Those sandboxes must be as confined as the first:
// pid 1 and every command under exactly one filter (Seccomp: 2, Seccomp_filters: 1,
// no_new_privs), and what the profile refuses still refused (unshare: EPERM).
func TestSeccompCompiledOnce(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	programs := func() []string {
		var out []string
		_ = filepath.WalkDir(d.DataDir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && filepath.Base(filepath.Dir(p)) == ".seccomp" && strings.HasSuffix(p, ".bpf") {
				out = append(out, p)
			}
			return nil
		})
		return out
	}
	configOf := func(id string) map[string]any {
		var found string
		_ = filepath.WalkDir(d.DataDir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && strings.HasSuffix(p, "/"+id+"/bundle/config.json") {
				found = p
			}
			return nil
		})
		if found == "" {
			t.Fatalf("no config.json of %s under %s", id, d.DataDir)
		}
		raw, err := os.ReadFile(found)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for i := range 3 {
		id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: limSpec()}})
		limWaitRunning(t, c, id)
		if len(programs()) == 0 {
			t.Fatalf("sandbox %d: no compiled seccomp program kept under %s", i, d.DataDir)
		}
		linux, _ := configOf(id)["linux"].(map[string]any)
		if _, ok := linux["seccomp"]; ok && i > 0 {
			t.Errorf("sandbox %d (%s): config.json still has linux.seccomp: runc compiled the profile again", i, id)
		}
		status := limMustExec(t, c, id, "sh", "-c", "grep -E '^(NoNewPrivs|Seccomp|Seccomp_filters):' /proc/1/status /proc/self/status | tr -s '\\t' ' '")
		for _, w := range []string{"/proc/1/status:NoNewPrivs: 1", "/proc/1/status:Seccomp: 2", "/proc/1/status:Seccomp_filters: 1", "/proc/self/status:Seccomp: 2", "/proc/self/status:Seccomp_filters: 1"} {
			if !strings.Contains(status, w) {
				t.Errorf("sandbox %d (%s): %q missing from\n%s", i, id, w, status)
			}
		}
		r, err := limExec(t, c, id, "unshare", "-U", "-m", "true")
		if err != nil {
			t.Fatal(err)
		}
		if r.GetExitCode() == 0 || !strings.Contains(string(r.GetStderr()), "Operation not permitted") {
			t.Errorf("sandbox %d (%s): unshare (refused by the profile): exit %d, stderr %q", i, id, r.GetExitCode(), r.GetStderr())
		}
	}
}
