// Package isolation attacks sandboxes from the inside, under every runtime class this
// machine offers (runc, and gVisor when runsc is built), and checks that every attempt
// fails while the host and a neighbour sandbox stay healthy. It prints a table: attempt ×
// runtime → outcome.
package isolation

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/sockmark"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

var env *stacktest.Env

func TestMain(m *testing.M) {
	if code, ok := testenv.MainRequiresRoot("isolation", "runc, namespaces, cgroups"); !ok {
		os.Exit(code)
	}
	var err error
	if env, err = stacktest.Setup("iso"); err != nil {
		fmt.Println("isolation:", err)
		os.Exit(1)
	}
	code := m.Run()
	env.Close()
	os.Exit(code)
}

func classes() []string {
	out := []string{"runc"}
	if local.FindRunsc() != "" {
		out = append(out, local.GVisorClass)
	}
	return out
}

type suite struct {
	t *testing.T
	s *stack.Stack
}

// newSuite starts a stack for t; every sandbox is deleted and the network removed when
// t ends.
func newSuite(t *testing.T, edit ...func(*stack.Config)) *suite {
	t.Helper()
	cfg := env.StackConfig(t.TempDir())
	for _, e := range edit {
		e(&cfg)
	}
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanup(t, s, cfg.DataDir) })
	return &suite{t: t, s: s}
}

func (su *suite) create(spec runtime.Spec) runner.Sandbox {
	su.t.Helper()
	sb, err := su.s.Runner.Create(context.Background(), runner.CreateRequest{Spec: spec, Lifetime: 10 * time.Minute})
	if err != nil {
		su.t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		cur, _ := su.s.Runner.Get(sb.ID)
		if cur.State == runner.StateRunning {
			return cur
		}
		if cur.State.Terminal() || time.Now().After(deadline) {
			su.t.Fatalf("sandbox %s: %s %s %s", sb.ID, cur.State, cur.Reason, cur.Message)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (su *suite) agent(id string) agentv1connect.AgentServiceClient {
	su.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := su.s.Runner.Agent(ctx, id, "")
	if err != nil {
		su.t.Fatal(err)
	}
	return c
}

func exec1(c agentv1connect.AgentServiceClient, timeout time.Duration, argv ...string) (*agentv1.ExecResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: argv}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// hostIP is an address of this host outside the sandboxes' bridge.
func hostIP(t *testing.T) string {
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || strings.HasPrefix(i.Name, "sbx") || i.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				return p.Addr().String()
			}
		}
	}
	t.Skip("no non-loopback IPv4 address on this host")
	return ""
}

// listen serves TCP on addr (answering "host") until the test ends.
func listen(t *testing.T, addr string) int {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln)
	return ln.Addr().(*net.TCPAddr).Port
}

// serve answers "host" to every connection on ln until the test ends.
func serve(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("host\n"))
			_ = c.Close()
		}
	}()
}

// listenIn serves TCP on addr inside the internet namespace until the test ends, and
// returns addr.
func listenIn(t *testing.T, in *egresstest.Internet, addr string) string {
	ln, err := in.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln)
	return addr
}

// metadataService gives the host the address 169.254.169.254 (on lo) with a listener on
// port 80, as a cloud's metadata service would be.
func metadataService(t *testing.T) {
	if out, err := exec.Command("ip", "addr", "add", "169.254.169.254/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("add 169.254.169.254: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", "169.254.169.254/32", "dev", "lo").Run() })
	listen(t, "169.254.169.254:80")
}

// TestEscapes runs attempts.py in a sandbox of every runtime class. The sandbox may reach
// one host name over HTTPS (egress rule dns_name) of a small "internet" beside the host
// (a network namespace with its own DNS and HTTPS servers), and nothing else.
func TestEscapes(t *testing.T) {
	in := egresstest.New(t)
	grantedIP, otherIP := in.Addr(t), in.Addr(t)
	in.SetA("api.granted.test", grantedIP)
	in.SetA("other.test", otherIP)
	in.ServeHTTPS(t, grantedIP, "api.granted.test")
	in.ServeHTTPS(t, otherIP, "other.test")
	outside := listenIn(t, in, otherIP.String()+":80")
	su := newSuite(t, func(c *stack.Config) {
		c.NoEgress = false // the rules below decide, not a blanket drop
		c.Nameservers = []string{in.DNS.String()}
	})
	script, err := os.ReadFile("attempts.py")
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(marker, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := listen(t, "0.0.0.0:0")
	metadataService(t)
	gw := env.Subnet.Addr().Next().String()
	neighbour := su.create(runtime.Spec{Container: runtime.Container{Image: env.Busybox(), Command: "/bin/sh", Args: []string{"-c", "echo hi > /tmp/i; exec httpd -f -p 8080 -h /tmp"}}})

	// Controls: every target answers the host, so a blocked attempt is the sandbox's
	// boundary at work, not a target that is not there. (The neighbour only with the
	// network's host mark, as the edge dials: the host reaches no sandbox port without.)
	d := net.Dialer{Timeout: 2 * time.Second, Control: sockmark.Control(su.s.EdgeDialMark())}
	for _, target := range []string{net.JoinHostPort(gw, fmt.Sprint(port)), net.JoinHostPort(hostIP(t), fmt.Sprint(port)),
		"169.254.169.254:80", net.JoinHostPort(neighbour.IP, "8080"), outside, net.JoinHostPort(otherIP.String(), "443"), in.DNS.String()} {
		var c net.Conn
		for range 50 {
			if c, err = d.Dial("tcp4", target); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("control: the host cannot reach %s: %v", target, err)
		}
		_ = c.Close()
	}

	table := map[string]map[string]string{}
	for _, class := range classes() {
		sb := su.create(runtime.Spec{Container: runtime.Container{Image: env.Python(), Command: "sleep", Args: []string{"infinity"}, Files: []runtime.File{{Path: "/app/attempts.py", Content: script}}}, RuntimeClass: class,
			Network: &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.granted.test"}}}})
		res, err := exec1(su.agent(sb.ID), 2*time.Minute, "python3", "/app/attempts.py", gw, hostIP(t), fmt.Sprint(port), neighbour.IP, fmt.Sprint(os.Getpid()), marker,
			"api.granted.test", "other.test", otherIP.String(), in.DNS.Addr().String())
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: attempts: %v %s", class, err, res.GetStderr())
		}
		var got map[string]string
		if err := json.Unmarshal(res.Stdout, &got); err != nil {
			t.Fatalf("%s: %v: %s", class, err, res.Stdout)
		}
		for attempt, outcome := range got {
			if table[attempt] == nil {
				table[attempt] = map[string]string{}
			}
			table[attempt][class] = outcome
			// A control must work (else a blocked attempt could be a broken network); every
			// attempt must fail.
			if control := strings.HasPrefix(attempt, "control:"); control != strings.HasPrefix(outcome, "ALLOWED") ||
				!control && !strings.HasPrefix(outcome, "blocked") {
				t.Errorf("%s: %s: %s", class, attempt, outcome)
			}
		}
	}
	printTable(t, table)
}

// TestAbuse: a fork bomb and a memory bomb hit their sandbox's own limits; the host and
// a neighbour sandbox keep answering meanwhile.
func TestAbuse(t *testing.T) {
	su := newSuite(t)
	s := su.s
	neighbour := su.create(runtime.Spec{Container: runtime.Container{Image: env.Busybox(), Command: "sleep", Args: []string{"infinity"}}})
	nc := su.agent(neighbour.ID)
	// healthy measures the neighbour's exec round trip (all must succeed) and the host's
	// ability to start a process, while abuse runs.
	healthy := func(what string) time.Duration {
		var worst time.Duration
		for range 10 {
			t0 := time.Now()
			if res, err := exec1(nc, 10*time.Second, "true"); err != nil || res.ExitCode != 0 {
				t.Errorf("%s: the neighbour's exec failed: %v", what, err)
			}
			worst = max(worst, time.Since(t0))
			if err := exec.Command("true").Run(); err != nil {
				t.Errorf("%s: the host cannot start a process: %v", what, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return worst
	}
	limits := runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20, Pids: 256, DiskBytes: diskLimit}
	rows := map[string]map[string]string{}
	type result struct {
		res *agentv1.ExecResponse
		err error
	}
	// bomb runs script in a new sandbox of class while checking the neighbour and the
	// host, and says how it was contained: the script failed (a limit refused it), or the
	// sandbox ended (gVisor ends the whole sandbox when it hits its memory limit).
	// check, when set, looks at the host after the bomb and returns a note for the table
	// (and fails the test itself).
	var check func(id string, before int64) string
	bomb := func(class, what, script string, ok func(out string) bool) {
		bomber := su.create(runtime.Spec{Container: runtime.Container{Image: env.Python(), Command: "sleep", Args: []string{"infinity"}, Resources: limits}, RuntimeClass: class})
		bc := su.agent(bomber.ID)
		usedBefore := treeUsage(t, dataRoot(s.Backend.SandboxDir(bomber.ID)))
		before := healthy(class + ": before " + what)
		done := make(chan result, 1)
		go func() {
			res, err := exec1(bc, time.Minute, "python3", "-c", script)
			done <- result{res, err}
		}()
		during := healthy(class + ": during " + what)
		r := <-done
		cur, _ := s.Runner.Get(bomber.ID)
		for wait := time.Now().Add(15 * time.Second); r.err != nil && !cur.State.Terminal() && time.Now().Before(wait); {
			time.Sleep(100 * time.Millisecond) // the exec broke off: the sandbox is ending
			cur, _ = s.Runner.Get(bomber.ID)
		}
		out := strings.TrimSpace(string(r.res.GetStdout()))
		health := fmt.Sprintf("; neighbour exec worst %v before, %v during", before.Round(time.Millisecond), during.Round(time.Millisecond))
		if check != nil {
			health += check(bomber.ID, usedBefore)
		}
		switch {
		case r.err == nil && ok(out):
			row(rows, what, class, fmt.Sprintf("contained by the limit: %s (exit %d)%s", out, r.res.GetExitCode(), health))
		case cur.State.Terminal():
			row(rows, what, class, fmt.Sprintf("contained: the sandbox ended (%s %s)%s", cur.State, cur.Reason, health))
		default:
			row(rows, what, class, "ALLOWED: "+out)
			t.Errorf("%s: %s not contained: %q %v (sandbox %s)", class, what, out, r.err, cur.State)
		}
		_, _ = s.Runner.Delete(bomber.ID, 0)
	}
	for _, class := range classes() {
		bomb(class, "fork bomb (pids limit 256)", `import os, time
t = time.time() + 5
n = 0
while time.time() < t:
    try:
        if os.fork() == 0:
            time.sleep(6); os._exit(0)
        n += 1
    except OSError:
        pass
print(n, "processes")`, func(out string) bool { n := atoi(out); return n > 0 && n < 256 })
		bomb(class, "memory bomb (1 GiB over a 256 MiB limit)", "b = b'x' * (1 << 30); print(len(b))",
			func(out string) bool { return out == "" })
		check = func(id string, before int64) string { return checkDisk(t, s.Backend.SandboxDir(id), before) }
		bomb(class, "disk filler (2 GiB into a 128 MiB disk limit)", diskFiller,
			func(out string) bool {
				n := atoi(out)
				return strings.Contains(out, "ENOSPC") && n > 0 && n <= diskLimit
			})
		check = nil
	}
	printTable(t, rows)
}

func row(rows map[string]map[string]string, attempt, class, outcome string) {
	if rows[attempt] == nil {
		rows[attempt] = map[string]string{}
	}
	rows[attempt][class] = outcome
}

func atoi(s string) int {
	var n int
	_, _ = fmt.Sscan(s, &n)
	return n
}

func printTable(t *testing.T, table map[string]map[string]string) {
	attempts := make([]string, 0, len(table))
	for a := range table {
		attempts = append(attempts, a)
	}
	sort.Strings(attempts)
	cls := classes()
	var b strings.Builder
	fmt.Fprintf(&b, "| attempt | %s |\n|---|%s\n", strings.Join(cls, " | "), strings.Repeat("---|", len(cls)))
	for _, a := range attempts {
		cells := make([]string, len(cls))
		for i, c := range cls {
			cells[i] = table[a][c]
		}
		fmt.Fprintf(&b, "| %s | %s |\n", a, strings.Join(cells, " | "))
	}

	fmt.Print(b.String())
}

func cleanup(t *testing.T, s *stack.Stack, dataDir string) {
	for _, sb := range s.Runner.List() {
		if !sb.State.Terminal() {
			_, _ = s.Runner.Delete(sb.ID, 0)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && slices.ContainsFunc(s.Runner.List(), func(sb runner.Sandbox) bool { return !sb.State.Terminal() }) {
		time.Sleep(100 * time.Millisecond)
	}
	s.Close()
	// Before the temporary dir goes: a leak is reported as what leaked.
	if left := stacktest.Leftovers(dataDir); len(left) > 0 {
		t.Errorf("left behind after every sandbox was deleted: %v", left)
		stacktest.ForceClean(dataDir)
	}
	if rd := s.Backend.RootfsDir(); rd != "" {
		if ents, _ := os.ReadDir(rd); len(ents) > 0 {
			t.Errorf("leaked root filesystem mount points in %s: %d", rd, len(ents))
		}
		_ = os.Remove(rd)
	}
	if err := s.Network.Cleanup(); err != nil {
		t.Errorf("network cleanup: %v", err)
	}
}
