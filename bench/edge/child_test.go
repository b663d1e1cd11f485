package edgebench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// The edge runs in a process of its own, as HAProxy does: in the benchmark's process it
// would share the Go scheduler's two Ps with the load generator and the backends while
// HAProxy gets its own threads.

const childEnv = "EDGE_BENCH_CHILD" // set: this process is the edge under test

type childConfig struct {
	CADir       string
	HTTPBackend netip.AddrPort
	TLSBackend  netip.AddrPort
}

// startEdge starts this test binary again as an edge in front of the backends.
func startEdge(caDir string, httpBackend, tlsBackend netip.AddrPort) (target, error) {
	cfg, err := json.Marshal(childConfig{caDir, httpBackend, tlsBackend})
	if err != nil {
		return target{}, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(cfg))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // closing it stops the child
	if err != nil {
		return target{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return target{}, err
	}
	if err := cmd.Start(); err != nil {
		return target{}, fmt.Errorf("start the edge: %w", err)
	}
	cleanups = append(cleanups, func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return target{}, fmt.Errorf("the edge did not say where it listens: %w", err)
	}
	addr := strings.TrimSpace(line)
	// One listener serves both jobs: routing is by SNI.
	return target{name: "edge", httpsAddr: addr, tlsAddr: addr, pid: cmd.Process.Pid}, nil
}

// runChild is the child's main: serve until stdin closes.
func runChild(cfgJSON string) error {
	var cfg childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return err
	}
	ca, err := pki.LoadOrCreateCA(cfg.CADir, "")
	if err != nil {
		return err
	}
	var routes edge.Table
	if err := routes.Set(sandboxID, []edge.Route{
		{SandboxID: sandboxID, Port: httpPort, Kind: edge.KindHTTPS, Backend: cfg.HTTPBackend},
		{SandboxID: sandboxID, Port: tlsPort, Kind: edge.KindPassthrough, Backend: cfg.TLSBackend},
	}); err != nil {
		return err
	}
	get, err := edge.WildcardCertificate(ca, runnerID, baseDomain, time.Hour)
	if err != nil {
		return err
	}
	e, err := edge.New(edge.Config{
		RunnerID: runnerID, BaseDomain: baseDomain, Routes: &routes, GetCertificate: get,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	defer e.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = e.Serve(ln) }()
	if path := os.Getenv("EDGE_BENCH_CPUPROFILE"); path != "" { // for finding the edge's costs
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}
