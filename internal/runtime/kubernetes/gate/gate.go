// Package gate is sandbox-gate, the helper the Kubernetes backend puts beside
// sandbox-agent in every Pod. One static binary, three roles:
//
//   - install (the gate container's postStart hook, which the kubelet runs before it
//     starts the next container): copies sandbox-agent and itself from the agent image
//     into the Pod's shared emptyDir, so any image can run them;
//   - exec-agent (the main container's entrypoint): completes the agent configuration
//     with what only the container knows (the image's environment and working dir, as
//     the kubelet set them up) and execs sandbox-agent, which so becomes PID 1;
//   - serve (the Pod's first container): the agent's TCP front. It listens on the Pod IP
//     with mTLS (both certificates per sandbox, pinned on both sides) and splices every
//     accepted connection to the agent's unix socket in the shared emptyDir. Its
//     postStart hook is `install`. It ends once the agent has ended (final status, socket
//     gone), after copying the agent's status.json into its termination message, so the
//     backend learns how the main command ended (exit code, restarts, reason) from the
//     Pod status.
//
// sandbox-agent itself is unchanged: it serves cleartext HTTP/2 on a unix socket, as
// under the local backend.
package gate

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// Paths inside the Pod, shared by the backend (which builds the Pod) and the gate.
const (
	// BinDir is the emptyDir holding the installed binaries, mounted read-only in the
	// main container at agentconfig.Dir + "/bin".
	BinDir    = agentconfig.Dir + "/bin"
	AgentPath = BinDir + "/sandbox-agent"
	GatePath  = BinDir + "/sandbox-gate"
	// ConfigDir is the Secret volume with the backend's agent config (ConfigFile).
	ConfigDir  = agentconfig.Dir + "/config"
	ConfigFile = "config.json"
	// RunDir is the agent's state dir (an emptyDir shared with the gate container).
	RunDir = agentconfig.StateDir
	// AgentConfigFile (in RunDir) is the completed config exec-agent writes.
	AgentConfigFile = "agent-config.json"
	// Socket (in RunDir) is where the agent listens.
	Socket = "agent.sock"
	// TLSDir is the Secret volume with the gate's key pair and the pinned client
	// certificate, mounted in the gate container only.
	TLSDir         = "/etc/sandbox-gate"
	TLSCertFile    = "tls.crt"
	TLSKeyFile     = "tls.key"
	ClientCertFile = "client.crt"
	// ContainersDir holds, in the gate container of a multi-container Pod, one directory
	// per container the gate serves: that container's RunDir emptyDir, mounted at
	// ContainersDir/<container name>. A connection names its container by its TLS server
	// name (SNI); none means the primary (RunDir).
	ContainersDir = "/sandbox-gate-containers"
	// Port is the gate's TCP port on the Pod IP.
	Port = 7443
	// UID is the gate container's user and group (non-root, as the Pod Security
	// Standard "restricted" asks; the distroless "nonroot" ID). The agent's socket is
	// handed to it (ListenAgent).
	UID = 65532
)

// Install copies the named files from srcDir to dstDir (mode 0755), atomically each.
func Install(srcDir, dstDir string, names ...string) error {
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(srcDir, n))
		if err != nil {
			return err
		}
		tmp := filepath.Join(dstDir, "."+n+".tmp")
		if err := os.WriteFile(tmp, b, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(tmp, 0o755); err != nil { // umask
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dstDir, n)); err != nil {
			return err
		}
	}
	return nil
}

// CompleteConfig fills in what the backend cannot know: the process environment the
// container started with (image env, then the spec's env on top) and, when the spec sets
// none, the working dir. Variables the kubelet injects for the cluster (KUBERNETES_*) are
// dropped unless the spec sets them. Variables named in c.EnvFromProcess (secrets the
// kubelet injects) stay out: the config is written to a file, and the agent takes them
// from its own environment (agentconfig.Config.TakeEnvFromProcess).
func CompleteConfig(c *agentconfig.Config, environ []string, cwd string) {
	base := make([]string, 0, len(environ))
	spec := map[string]string{}
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		spec[k] = v
	}
	fromProcess := make(map[string]bool, len(c.EnvFromProcess))
	for _, k := range c.EnvFromProcess {
		fromProcess[k] = true
		delete(spec, k)
	}
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if fromProcess[k] {
			continue
		}
		if _, ok := spec[k]; !ok && (strings.HasPrefix(k, "KUBERNETES_") || k == "HOSTNAME") {
			continue
		}
		base = append(base, kv)
	}
	c.Env = agentconfig.MergeEnv(base, spec)
	if c.WorkingDir == "" {
		c.WorkingDir = cwd
	}
	c.Listen = "unix:" + filepath.Join(RunDir, Socket)
}

// FlagTerminationLog, after exec-agent, makes the agent leave its final status in the
// container's termination message (TerminationLogPath): given to sidecars only.
const FlagTerminationLog = "--termination-log"

// ExecAgent completes the backend's config and replaces this process with the agent;
// termLog: see FlagTerminationLog.
func ExecAgent(termLog bool) error {
	c, err := agentconfig.Load(filepath.Join(ConfigDir, ConfigFile))
	if err != nil {
		return err
	}
	cwd, _ := os.Getwd()
	CompleteConfig(c, os.Environ(), cwd)
	b, err := jsonMarshal(c)
	if err != nil {
		return err
	}
	p := filepath.Join(RunDir, AgentConfigFile)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return err
	}
	ln, err := ListenAgent(filepath.Join(RunDir, Socket), c.User, UID)
	if err != nil {
		return err
	}
	defer ln.Close() // only if exec fails
	argv := []string{AgentPath, "--config", p, "--state-dir", RunDir, "--listen-fd", strconv.Itoa(int(ln.Fd()))}
	if termLog {
		// A sidecar's restarts and exit stay known once its agent is gone (the
		// backend's ContainerStatuses), also when no Watch of the backend saw them.
		argv = append(argv, "--termination-log", TerminationLogPath)
	}
	return syscall.Exec(AgentPath, argv, os.Environ())
}

// TerminationLogPath is the kubelet's default termination message file of a container.
const TerminationLogPath = "/dev/termination-log"

// ListenAgent makes the agent's unix socket at path, which only the gate (uid, non-root)
// may connect to, and returns its listening fd, kept open across exec for the agent.
//
// Connecting needs write permission on the socket. The socket is given to the gate's
// user (mode 0600): the container's other processes (commands run as another user) must
// not reach the agent, which runs as root. That needs CAP_CHOWN, which the agent keeps
// whenever commands run as another user (the kubernetes backend's securityFor). Without
// it (e.g. an image whose USER is not root, or everything dropped for a root command
// user) every process in the container runs as the agent's own user, so a socket open
// to all (0777) grants none of them anything: then that is the fallback.
func ListenAgent(path, commandUser string, uid int) (*os.File, error) {
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // the agent serves it after exec
	f, err := ln.File()        // a dup: it stays open (and is the agent's) once ln is closed
	_ = ln.Close()
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	mode := os.FileMode(0o600)
	if err := os.Chown(path, uid, uid); err != nil {
		if !sameUser(commandUser) {
			f.Close()
			return nil, fmt.Errorf("agent socket: hand it to the gate (uid %d) while commands run as %q: %w", uid, commandUser, err)
		}
		mode = 0o777
	}
	if err := os.Chmod(path, mode); err != nil {
		f.Close()
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_SETFD, 0); e != 0 {
		f.Close()
		return nil, fmt.Errorf("agent socket: keep it across exec: %w", e)
	}
	return f, nil
}

// sameUser reports whether commands run as the agent's own user: the agent config's
// User is empty (the container's user) or root while the agent is root.
func sameUser(commandUser string) bool {
	u, _, _ := strings.Cut(commandUser, ":")
	return u == "" || (os.Getuid() == 0 && (u == "0" || u == "root"))
}

// ServeOptions configure Serve.
type ServeOptions struct {
	Listen         string // default ":7443"
	CertFile       string
	KeyFile        string
	ClientCertFile string // the only client certificate accepted
	Upstream       string // the agent's unix socket
	// ContainersDir, when set, holds <name>/Socket for every container a connection may
	// name by its TLS server name (multi-container Pods); a connection without one goes to
	// Upstream.
	ContainersDir string
	// DialTimeout bounds how long a connection waits for the agent to listen (default 30 s).
	DialTimeout time.Duration
	// StatusFile is the agent's status.json. Serve returns once the agent has ended: the
	// status is final, or ctx has ended, and the agent's socket refuses connections.
	// The file is then copied to TerminationLog.
	StatusFile     string
	TerminationLog string
	// HoldFor, when set, names a container under ContainersDir whose agent keeps the
	// gate up after the primary's agent has ended, until that agent has ended too (its
	// socket refuses connections) or ctx has ended: the Kubernetes backend archives a
	// GLOBAL volume writer's copy through the filler after the workload stopped.
	HoldFor string
	// HelloAddr, HelloID and HelloKeyFile, when all set: the gate sends the runner its
	// hello (hello.go) once Upstream exists.
	HelloAddr, HelloID, HelloKeyFile string
	Logger                           *slog.Logger
	// holdAppear, for tests, replaces holdAppear (0: holdAppear).
	holdAppear time.Duration
}

// FlagHold, after serve, is followed by ServeOptions.HoldFor.
const FlagHold = "--hold"

// ServerTLS is the gate's TLS config: its certificate, and the client must present
// exactly clientCert (DER).
func ServerTLS(cert tls.Certificate, clientCert []byte) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert,
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{"h2"},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], clientCert) {
				return errors.New("sandbox-gate: client certificate not accepted")
			}
			return nil
		},
	}
}

// ClientTLS is the backend's side: it presents cert and accepts only serverCert (DER).
func ClientTLS(cert tls.Certificate, serverCert []byte) *tls.Config {
	return &tls.Config{
		Certificates:       []tls.Certificate{cert},
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{"h2"},
		InsecureSkipVerify: true, //nolint:gosec // the server certificate is pinned below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], serverCert) {
				return errors.New("sandbox-gate: server certificate does not match the sandbox's")
			}
			return nil
		},
	}
}

// Serve runs the gate until the agent has ended (see ServeOptions.StatusFile).
func Serve(ctx context.Context, o ServeOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Listen == "" {
		o.Listen = fmt.Sprintf(":%d", Port)
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 30 * time.Second
	}
	cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	if err != nil {
		return err
	}
	clientCert, err := readCertDER(o.ClientCertFile)
	if err != nil {
		return err
	}
	ln, err := tls.Listen("tcp", o.Listen, ServerTLS(cert, clientCert))
	if err != nil {
		return err
	}
	done, stop := context.WithCancel(context.Background())
	defer stop()
	if o.HelloAddr != "" && o.HelloID != "" && o.HelloKeyFile != "" {
		hctx, hcancel := context.WithCancel(ctx)
		defer hcancel()
		go SendHellos(hctx, o.HelloAddr, o.HelloID, o.HelloKeyFile, o.Upstream, log)
	}
	go func() {
		agentEnded(ctx, o.StatusFile, o.Upstream)
		if o.HoldFor != "" {
			if sock, err := o.upstream(o.HoldFor); err == nil {
				appear := holdAppear
				if o.holdAppear > 0 {
					appear = o.holdAppear
				}
				socketGone(ctx, sock, appear)
			}
		}
		stop()
		ln.Close()
	}()
	var wg sync.WaitGroup
	for {
		c, err := ln.Accept()
		if err != nil {
			if done.Err() != nil {
				break
			}
			log.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			splice(done, c.(*tls.Conn), o.upstream, o.DialTimeout, log)
		}()
	}
	if o.StatusFile != "" && o.TerminationLog != "" {
		if b, err := readStatus(o.StatusFile); err == nil {
			_ = os.WriteFile(o.TerminationLog, b, 0o644)
		}
	}
	return nil
}

// agentEnded returns once the agent has ended: its status is final (or stop has ended)
// and its socket refuses connections.
func agentEnded(stop context.Context, statusFile, socket string) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for range t.C {
		if stop.Err() == nil && !statusFinal(statusFile) {
			continue
		}
		c, err := net.DialTimeout("unix", socket, time.Second)
		if err != nil {
			return
		}
		c.Close()
	}
}

// holdAppear bounds how long the hold waits for the held agent's socket to answer a
// first time: a refusal before that is "not there yet" (the held container still
// starting), not "gone"; a held agent that never answers within it ends the hold.
const holdAppear = 2 * time.Minute

// socketGone returns once the agent socket, having answered at least once (or not
// within the duration within), refuses connections, or ctx has ended.
func socketGone(ctx context.Context, socket string, within time.Duration) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	seen := false
	appear := time.Now().Add(within)
	for ctx.Err() == nil {
		c, err := net.DialTimeout("unix", socket, time.Second)
		if err != nil && (seen || !time.Now().Before(appear)) {
			return
		}
		if err == nil {
			seen = true
			c.Close()
		}
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

// maxStatusBytes bounds status.json: the agent writes a few hundred bytes, and the
// kubelet keeps at most 4 KiB of a termination log anyway.
const maxStatusBytes = 4096

// readStatus reads the agent's status file, which lies in the run dir the sandbox can
// write: never through a symlink, only a regular file, at most maxStatusBytes (so the
// sandbox cannot make the gate copy one of its own files into the Pod's status).
func readStatus(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > maxStatusBytes {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, maxStatusBytes)
	}
	return io.ReadAll(io.LimitReader(f, maxStatusBytes))
}

func statusFinal(path string) bool {
	b, err := readStatus(path)
	if err != nil {
		return false
	}
	var st struct {
		State string `json:"state"`
	}
	if json.Unmarshal(b, &st) != nil {
		return false
	}
	switch st.State {
	case "MAIN_STATE_COMPLETED", "MAIN_STATE_FAILED", "MAIN_STATE_STOPPED":
		return true
	}
	return false
}

// upstream is the agent socket of the container a connection names by its TLS server
// name: Upstream without one, else ContainersDir/<name>/Socket. The name is a DNS-1123
// label (no path tricks) and must be one of the directories the Pod spec mounted there
// (the gate's root file system is read-only: nothing else makes entries). The socket
// lies in that container's own emptyDir, so the container could swap it for a symlink:
// only a socket itself is dialled (and the backend verifies the agent's identity, per
// container, on every connection anyway).
func (o *ServeOptions) upstream(serverName string) (string, error) {
	if serverName == "" {
		return o.Upstream, nil
	}
	if o.ContainersDir == "" || !dnsLabel(serverName) {
		return "", fmt.Errorf("unknown container %q", serverName)
	}
	dir := filepath.Join(o.ContainersDir, serverName)
	if st, err := os.Lstat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("unknown container %q", serverName)
	}
	return filepath.Join(dir, Socket), nil
}

// dnsLabel reports whether s is a DNS-1123 label (container names are).
func dnsLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

func splice(ctx context.Context, c *tls.Conn, pick func(serverName string) (string, error), timeout time.Duration, log *slog.Logger) {
	defer func() { _ = c.Close() }()
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := c.HandshakeContext(hctx)
	cancel()
	if err != nil {
		log.Debug("handshake", "err", err)
		return
	}
	upstream, err := pick(c.ConnectionState().ServerName)
	if err != nil {
		log.Warn("connection refused", "err", err)
		return
	}
	var up net.Conn
	deadline := time.Now().Add(timeout)
	for {
		var d net.Dialer
		if st, serr := os.Lstat(upstream); serr == nil && st.Mode()&os.ModeSocket == 0 {
			log.Warn("dial agent: not a socket", "path", upstream)
			return
		}
		up, err = d.DialContext(ctx, "unix", upstream)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		log.Warn("dial agent", "err", err)
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, c)
		if u, ok := up.(*net.UnixConn); ok {
			_ = u.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		_ = c.CloseWrite()
		done <- struct{}{}
	}()
	<-done
	<-done
}
