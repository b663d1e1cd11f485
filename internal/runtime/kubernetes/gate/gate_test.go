package gate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

func keyPair(t *testing.T, dir, name string) (tls.Certificate, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	cp := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kp := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	if dir != "" {
		_ = os.WriteFile(filepath.Join(dir, name+".crt"), cp, 0o600)
		_ = os.WriteFile(filepath.Join(dir, name+".key"), kp, 0o600)
	}
	c, err := tls.X509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	return c, der
}

// TestServe: the gate splices a pinned client to the upstream socket, refuses other
// clients, and ends (writing the termination message) once the agent has ended.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	_, serverDER := keyPair(t, dir, "server")
	client, _ := keyPair(t, dir, "client")
	stranger, _ := keyPair(t, "", "stranger")
	sock := filepath.Join(dir, "agent.sock")
	up, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // echo, upper-cased
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write([]byte(strings.ToUpper(string(b))))
			}()
		}
	}()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	status := filepath.Join(dir, "status.json")
	term := filepath.Join(dir, "termination-log")
	served := make(chan error, 1)
	go func() {
		served <- Serve(context.Background(), ServeOptions{
			Listen: addr, CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
			ClientCertFile: filepath.Join(dir, "client.crt"), Upstream: sock, StatusFile: status, TerminationLog: term,
		})
	}()
	dial := func(cert tls.Certificate) (string, error) {
		var c *tls.Conn
		var err error
		for i := 0; i < 50; i++ {
			if c, err = tls.Dial("tcp", addr, ClientTLS(cert, serverDER)); err == nil || !strings.Contains(err.Error(), "refused") {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return "", err
		}
		defer c.Close()
		if _, err := c.Write([]byte("hello")); err != nil {
			return "", err
		}
		_ = c.CloseWrite()
		b, err := io.ReadAll(c)
		return string(b), err
	}
	if got, err := dial(client); err != nil || got != "HELLO" {
		t.Fatalf("pinned client: %q, %v", got, err)
	}
	if got, err := dial(stranger); err == nil && got != "" {
		t.Fatalf("a stranger's certificate was accepted: %q", got)
	}
	// The client refuses a server with another certificate.
	_, otherDER := keyPair(t, "", "other")
	if c, err := tls.Dial("tcp", addr, ClientTLS(client, otherDER)); err == nil {
		c.Close()
		t.Fatal("client accepted a server certificate that is not the sandbox's")
	}

	// Agent ends: final status, socket gone.
	final := `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed"}`
	if err := os.WriteFile(status, []byte(final), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-served:
		t.Fatal("gate ended while the agent still listens")
	case <-time.After(300 * time.Millisecond):
	}
	up.Close()
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("gate did not end after the agent")
	}
	if b, _ := os.ReadFile(term); string(b) != final {
		t.Errorf("termination message %q, want the final status", b)
	}
}

func TestCompleteConfig(t *testing.T) {
	c := &agentconfig.Config{Argv: []string{"x"}, Env: []string{"A=spec", "KUBERNETES_PORT=mine"}}
	CompleteConfig(c, []string{"PATH=/bin", "A=image", "LANG=C", "KUBERNETES_SERVICE_HOST=10.0.0.1", "KUBERNETES_PORT=x", "HOSTNAME=pod"}, "/work")
	if got := strings.Join(c.Env, " "); got != "PATH=/bin A=spec LANG=C KUBERNETES_PORT=mine" {
		t.Errorf("env %q", got)
	}
	if c.WorkingDir != "/work" || c.Listen != "unix:"+RunDir+"/"+Socket {
		t.Errorf("working dir %q, listen %q", c.WorkingDir, c.Listen)
	}
}

// TestListenAgent: the agent's socket belongs to the gate's user with mode 0600 (other
// users in the main container cannot connect), and the fd survives exec and serves.
func TestListenAgent(t *testing.T) {
	testenv.RequireRoot(t, "chown to the gate's uid")
	path := filepath.Join(t.TempDir(), Socket)
	f, err := ListenAgent(path, "1000", UID)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != UID || st.Gid != UID || st.Mode&0o777 != 0o600 {
		t.Errorf("socket owner %d:%d mode %o, want %d:%d 600", st.Uid, st.Gid, st.Mode&0o777, UID, UID)
	}
	flags, _, e := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_GETFD, 0)
	if e != 0 || flags&syscall.FD_CLOEXEC != 0 {
		t.Errorf("fd flags %d (err %v): closed on exec", flags, e)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, _ := io.ReadAll(c); string(b) != "ok" {
		t.Errorf("read %q", b)
	}
}

// TestServeContainers: a connection's TLS server name picks the container's agent socket
// under ContainersDir; none picks the primary's; a name that is not a mounted container
// (or a path trick) and a symlink in place of a socket get no upstream at all.
func TestServeContainers(t *testing.T) {
	dir := t.TempDir()
	_, serverDER := keyPair(t, dir, "server")
	client, _ := keyPair(t, dir, "client")
	serve := func(path, reply string) {
		up, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { up.Close() })
		go func() {
			for {
				c, err := up.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte(reply))
				c.Close()
			}
		}()
	}
	primary := filepath.Join(dir, "primary.sock")
	serve(primary, "primary")
	containers := filepath.Join(dir, "containers")
	for _, n := range []string{"app", "redis", "evil"} {
		if err := os.MkdirAll(filepath.Join(containers, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	serve(filepath.Join(containers, "app", Socket), "app")
	serve(filepath.Join(containers, "redis", Socket), "redis")
	// evil's socket is a symlink to redis': never followed.
	if err := os.Symlink(filepath.Join(containers, "redis", Socket), filepath.Join(containers, "evil", Socket)); err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = Serve(ctx, ServeOptions{
			Listen: addr, CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
			ClientCertFile: filepath.Join(dir, "client.crt"), Upstream: primary, ContainersDir: containers,
			DialTimeout: 200 * time.Millisecond,
		})
	}()
	dial := func(name string) string {
		cfg := ClientTLS(client, serverDER)
		cfg.ServerName = name
		var c *tls.Conn
		var err error
		for i := 0; i < 50; i++ {
			if c, err = tls.Dial("tcp", addr, cfg); err == nil || !strings.Contains(err.Error(), "refused") {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("dial %q: %v", name, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}
	for name, want := range map[string]string{"": "primary", "app": "app", "redis": "redis", "evil": "", "nope": "", "app.x": ""} {
		if got := dial(name); got != want {
			t.Errorf("server name %q reached %q, want %q", name, got, want)
		}
	}
	// Names a Go client would not even send: refused by the gate itself.
	o := &ServeOptions{Upstream: primary, ContainersDir: containers}
	for _, n := range []string{"..", "../containers/app", "app/", "APP", "-app"} {
		if p, err := o.upstream(n); err == nil {
			t.Errorf("server name %q picked %s", n, p)
		}
	}
}

// TestCompleteConfigEnvFromProcess: the variables the agent takes from its own
// environment (secrets) are not written into the completed config, only their names.
func TestCompleteConfigEnvFromProcess(t *testing.T) {
	c := &agentconfig.Config{Argv: []string{"x"}, Env: []string{"A=spec"}, EnvFromProcess: []string{"TOKEN"}}
	CompleteConfig(c, []string{"PATH=/bin", "TOKEN=s3cret", "A=image"}, "/")
	if got := strings.Join(c.Env, " "); got != "PATH=/bin A=spec" {
		t.Errorf("env %q", got)
	}
	b, err := jsonMarshal(c)
	if err != nil || strings.Contains(string(b), "s3cret") || !strings.Contains(string(b), `"env_from_process":["TOKEN"]`) {
		t.Errorf("written config %s, %v", b, err)
	}
}

// TestServeHold: with HoldFor, the gate stays up after the primary's agent has ended
// (final status, socket gone) while the held container's agent listens, serves it,
// and ends (the primary's status in its termination log) once that agent has ended.
func TestServeHold(t *testing.T) { testServeHold(t, 0) }

// TestServeHoldLate: the held container's agent listens only after the primary's has
// ended (the filler still starting): the gate waits for its socket to appear rather
// than taking "not there yet" for "gone".
func TestServeHoldLate(t *testing.T) { testServeHold(t, 700*time.Millisecond) }

// holdGate is the set-up of the hold tests: the gate's options with HoldFor "filler"
// (its container directory made, no agent listening yet), a primary whose status is
// final and whose socket is gone; the client's certificate and the server's (DER).
func holdGate(t *testing.T) (ServeOptions, tls.Certificate, []byte) {
	t.Helper()
	dir := t.TempDir()
	_, serverDER := keyPair(t, dir, "server")
	client, _ := keyPair(t, dir, "client")
	status := filepath.Join(dir, "status.json")
	if err := os.WriteFile(status, []byte(`{"state":"MAIN_STATE_COMPLETED","exit_code":0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	containers := filepath.Join(dir, "containers")
	if err := os.MkdirAll(filepath.Join(containers, "filler"), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	return ServeOptions{
		Listen: addr, CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.crt"), Upstream: filepath.Join(dir, "primary.sock"), ContainersDir: containers,
		StatusFile: status, TerminationLog: filepath.Join(dir, "termination-log"), HoldFor: "filler", DialTimeout: 200 * time.Millisecond,
	}, client, serverDER
}

func testServeHold(t *testing.T, late time.Duration) {
	opts, client, serverDER := holdGate(t)
	containers, addr, termLog := opts.ContainersDir, opts.Listen, opts.TerminationLog
	listen := func() net.Listener {
		filler, err := net.Listen("unix", filepath.Join(containers, "filler", Socket))
		if err != nil {
			t.Error(err)
		}
		return filler
	}
	fillerc := make(chan net.Listener, 1)
	if late == 0 {
		fillerc <- listen()
	} else {
		time.AfterFunc(late, func() { fillerc <- listen() })
	}
	ended := make(chan error, 1)
	go func() { ended <- Serve(context.Background(), opts) }()
	var filler net.Listener
	select {
	case err := <-ended:
		t.Fatalf("the gate ended before the held agent listened: %v", err)
	case filler = <-fillerc:
	}
	if filler == nil {
		t.FailNow()
	}
	go func() {
		for {
			c, err := filler.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("filler"))
			c.Close()
		}
	}()
	select {
	case err := <-ended:
		t.Fatalf("the gate ended while the held agent listens: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	cfg := ClientTLS(client, serverDER)
	cfg.ServerName = "filler"
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(c); string(b) != "filler" {
		t.Errorf("the held container's agent answered %q", b)
	}
	c.Close()
	filler.Close()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not end once the held agent had")
	}
	if b, err := os.ReadFile(termLog); err != nil || !strings.Contains(string(b), "MAIN_STATE_COMPLETED") {
		t.Errorf("termination log %q, %v: want the primary's status", b, err)
	}
}

// TestServeHoldBounded: a held container whose agent never listens (its socket never
// appears) does not keep the gate up for ever: the hold ends once holdAppear has passed
// without an answer, and the gate ends as without a hold (the primary's status in the
// termination log). The production bound is 2 minutes; the test shortens it.
func TestServeHoldBounded(t *testing.T) {
	if holdAppear != 2*time.Minute {
		t.Errorf("holdAppear = %v, want 2m (docs/volumes.md)", holdAppear)
	}
	opts, _, _ := holdGate(t)
	const bound = 600 * time.Millisecond
	opts.holdAppear = bound
	termLog := opts.TerminationLog
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	ended := make(chan error, 1)
	go func() { ended <- Serve(ctx, opts) }()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < bound {
			t.Errorf("the gate ended after %v, before the held socket's %v to appear", took, bound)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gate still holds for a held agent that never listened, 10 s on (bound 600 ms)")
	}
	if b, err := os.ReadFile(termLog); err != nil || !strings.Contains(string(b), "MAIN_STATE_COMPLETED") {
		t.Errorf("termination log %q, %v: want the primary's status", b, err)
	}
}
