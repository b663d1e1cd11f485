package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func u32(v uint32) *uint32 { return &v }

// TestSecurityContext runs one sandbox per security context and checks, inside, what
// each must change (and what it must leave alone).
func TestSecurityContext(t *testing.T) {
	e := newEnv(t)
	type check struct {
		argv []string
		want string // stdout, trimmed
	}
	tests := []struct {
		name  string
		sec   *runtime.Security
		files []runtime.File
		// main runs as the main command (its output lands in /tmp/main, read back by
		// the first check when set).
		main   string
		checks []check
	}{
		{
			name: "read-only root", sec: &runtime.Security{ReadOnlyRootFS: true},
			files: []runtime.File{{Path: "/tmp/in/given.txt", Content: []byte("given")}},
			checks: []check{
				{[]string{"sh", "-c", "touch /etc/x 2>/dev/null; echo rc=$?"}, "rc=1"},
				{[]string{"sh", "-c", "echo x > /bin/x 2>/dev/null; echo rc=$?"}, "rc=1"},
				{[]string{"sh", "-c", "echo ok > /tmp/w && cat /tmp/w"}, "ok"},
				{[]string{"sh", "-c", "echo ok > /var/tmp/w && echo ok > /run/w && echo ok > /dev/shm/w && echo done"}, "done"},
				{[]string{"stat", "-f", "-c", "%T", "/tmp"}, "tmpfs"},
				{[]string{"cat", "/tmp/in/given.txt"}, "given"},
				{[]string{"sh", "-c", "grep -c ' / overlay ro,' /proc/self/mounts"}, "1"},
			},
		},
		{
			name: "run as user and group", sec: &runtime.Security{RunAsUser: u32(1000), RunAsGroup: u32(1001)},
			main: "id -u > /tmp/main; id -g >> /tmp/main; exec sleep 3600",
			checks: []check{
				{[]string{"cat", "/tmp/main"}, "1000\n1001"},
				{[]string{"id", "-u"}, "1000"}, // the default exec user
				{[]string{"id", "-g"}, "1001"},
				{[]string{"sh", "-c", "touch /etc/x 2>/dev/null; echo rc=$?"}, "rc=1"},
			},
		},
		{
			name: "run as user only takes the group from passwd", sec: &runtime.Security{RunAsUser: u32(1000)},
			checks: []check{{[]string{"id"}, "uid=1000(user) gid=1000(user)"}},
		},
		{
			name: "drop ALL", sec: &runtime.Security{CapDrop: []string{"ALL"}},
			checks: []check{
				{[]string{"sh", "-c", "grep CapEff /proc/self/status | cut -f2"}, "0000000000000000"},
				{[]string{"sh", "-c", "chown 1000 /etc/passwd 2>/dev/null; echo rc=$?"}, "rc=1"},
			},
		},
		{
			// The agent keeps what it needs to run commands as user 1000; the commands
			// themselves have no capabilities.
			name: "drop ALL as a user", sec: &runtime.Security{CapDrop: []string{"ALL"}, RunAsUser: u32(1000)},
			main: "id -u > /tmp/main; grep CapEff /proc/self/status | cut -f2 >> /tmp/main; exec sleep 3600",
			checks: []check{
				{[]string{"cat", "/tmp/main"}, "1000\n0000000000000000"},
				{[]string{"sh", "-c", "id -u; grep -E 'CapEff|CapPrm' /proc/self/status | cut -f2"}, "1000\n0000000000000000\n0000000000000000"},
				{[]string{"sh", "-c", "grep CapEff /proc/1/status | cut -f2"}, "00000000000000eb"}, // the agent: CHOWN DAC_OVERRIDE FOWNER KILL SETGID SETUID
			},
		},
		{
			name: "drop one", sec: &runtime.Security{CapDrop: []string{"CAP_CHOWN"}},
			checks: []check{
				{[]string{"sh", "-c", "chown 1000 /etc/passwd 2>/dev/null; echo rc=$?"}, "rc=1"},
				{[]string{"sh", "-c", "grep CapBnd /proc/self/status | cut -f2"}, "00000000a80405fa"},
			},
		},
		{
			name: "add NET_ADMIN", sec: &runtime.Security{CapAdd: []string{"CAP_NET_ADMIN"}},
			checks: []check{
				{[]string{"sh", "-c", "grep CapEff /proc/self/status | cut -f2"}, "00000000a80415fb"},
				// The sandbox owns its (loopback-only) network namespace, so NET_ADMIN works there.
				{[]string{"sh", "-c", "ip link set lo mtu 1500 && echo ok"}, "ok"},
			},
		},
		{
			name: "defaults", sec: nil,
			checks: []check{
				{[]string{"sh", "-c", "grep NoNewPrivs /proc/self/status | cut -f2"}, "1"},
				{[]string{"id", "-u"}, "0"},
			},
		},
		{
			name: "privilege escalation allowed", sec: &runtime.Security{AllowPrivilegeEscalation: true, SeccompProfile: runtime.SeccompRuntimeDefault},
			checks: []check{
				{[]string{"sh", "-c", "grep NoNewPrivs /proc/self/status | cut -f2"}, "0"},
				{[]string{"sh", "-c", "grep ^Seccomp: /proc/self/status | cut -f2"}, "2"},
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("sec-%d", i)
			main := tc.main
			if main == "" {
				main = "exec sleep 3600"
			}
			e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sh", Args: []string{"-c", main}, Security: tc.sec, Files: tc.files}})
			defer func() {
				if err := e.b.Destroy(context.Background(), id); err != nil {
					t.Error(err)
				}
			}()
			c := agentClient(e.b, id)
			defer func() {
				if t.Failed() {
					out, _ := os.ReadFile(filepath.Join(e.b.dir(id), fileAgentOut))
					t.Logf("agent output: %s", out)
				}
			}()
			for _, ch := range tc.checks {
				var out, errOut string
				var code int32
				for try := 0; try < 50; try++ { // the main command may not have written yet
					out, errOut, code = execIn(t, c, ch.argv...)
					if strings.TrimRight(out, "\n") == ch.want || tc.main == "" {
						break
					}
				}
				if strings.TrimRight(out, "\n") != ch.want {
					t.Errorf("%q: %q (stderr %q, exit %d), want %q", ch.argv, out, errOut, code, ch.want)
				}
			}
		})
	}
}

func TestSecurityContextRejected(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		spec runtime.Spec
		want string
	}{
		{"uid beyond the user namespace", runtime.Spec{Container: runtime.Container{Security: &runtime.Security{RunAsUser: u32(70000)}}}, "below 65536"},
		{"gid beyond the user namespace", runtime.Spec{Container: runtime.Container{Security: &runtime.Security{RunAsGroup: u32(65536)}}}, "below 65536"},
		{"file on a read-only root", runtime.Spec{Container: runtime.Container{Security: &runtime.Security{ReadOnlyRootFS: true}, Files: []runtime.File{{Path: "/etc/app.conf", Content: []byte("x")}}}}, "read-only root filesystem"},
		{"unknown seccomp profile", runtime.Spec{Container: runtime.Container{Security: &runtime.Security{SeccompProfile: "Unconfined"}}}, "only \"RuntimeDefault\""},
		{"unknown capability", runtime.Spec{Container: runtime.Container{Security: &runtime.Security{CapAdd: []string{"CAP_BOGUS"}}}}, "canonical Linux capability"},
		{"non-canonical capability", runtime.Spec{Container: runtime.Container{Security: &runtime.Security{CapDrop: []string{"net_raw"}}}}, "canonical Linux capability"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.ID, spec.Image, spec.Command = "rejected", "busybox", "true"
			_, err := e.b.Create(context.Background(), &spec)
			if !isErr(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create = %v, want ErrInvalidSpec mentioning %q", err, tc.want)
			}
		})
	}
}

// TestGVisorIDPrefixAttack: runsc takes a container id as an abbreviation (see runscID),
// and ids can be chosen by callers. With a sandbox "gvpre2" beside it, every runsc
// command on "gvpre" failed as ambiguous (it could be neither stopped nor destroyed),
// and once "gvpre"'s container was gone, its teardown (say again, after one that failed
// half-way) deleted "gvpre2". Here "gvpre" is deleted, then torn down again: the victim
// "gvpre2" must keep running, and a kill naming "gvpre" must not reach it.
func TestGVisorIDPrefixAttack(t *testing.T) {
	e := gvisorEnv(t)
	ctx := context.Background()
	victim := runtime.Spec{ID: "gvpre2", RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}}
	attacker := runtime.Spec{ID: "gvpre", RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}}
	e.create(victim)
	e.create(attacker)
	rt := e.b.runtimes[GVisorClass]
	if _, err := rt.run(ctx, "delete", "--force", attacker.ID); err != nil {
		t.Fatal(err)
	}
	s := &sandbox{id: attacker.ID, cid: attacker.ID, dir: e.b.dir(attacker.ID), rt: rt}
	if err := e.b.teardown(ctx, s); err != nil {
		t.Logf("teardown of the gone container: %v", err)
	}
	if err := rt.kill(ctx, attacker.ID, "KILL"); !notExist(err) {
		t.Errorf("kill of the gone container: %v, want does not exist", err)
	}
	if out, _, c := execIn(t, agentClient(e.b, victim.ID), "echo", "alive"); c != 0 || out != "alive\n" {
		t.Fatalf("the victim after the attacker's teardown: %q exit %d", out, c)
	}
	st, err := rt.state(ctx, victim.ID)
	if err != nil || st.Status != "running" {
		t.Errorf("victim state %+v, %v: want running", st, err)
	}
}
