package main

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agentbin")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755) // TestPermissionDenied runs the agent as nobody
	if binary, err = testenv.Agent(dir); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// sandboxDir is a world-readable temp dir (the agent may run as nobody).
func sandboxDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "sbx")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o777)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func writeConfig(t *testing.T, dir string, cfg *agentconfig.Config) string {
	b, _ := json.Marshal(cfg)
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func client(sock string) agentv1connect.AgentServiceClient {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}

// TestInheritedListenerAndSIGTERM runs the agent as the backend does: listening socket
// on fd 3, SIGTERM to stop.
func TestInheritedListenerAndSIGTERM(t *testing.T) {
	dir := sandboxDir(t)
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	lf, _ := ln.(*net.UnixListener).File()
	ln.Close()
	cfgPath := writeConfig(t, dir, &agentconfig.Config{
		Argv:       []string{"sh", "-c", `trap 'echo term; exit 4' TERM; touch trapped; while :; do sleep 0.02; done`},
		Env:        []string{"PATH=/usr/bin:/bin"},
		WorkingDir: dir, RestartLimit: 6,
	})
	state := filepath.Join(dir, "run")
	cmd := exec.Command(binary, "--config", cfgPath, "--state-dir", state)
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	c := client(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"echo", "hi"}}))
	if err != nil || string(res.Msg.Stdout) != "hi\n" {
		t.Fatalf("exec: %v %v", res, err)
	}
	watch, err := c.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for watch.Receive() && watch.Msg().State != agentv1.MainState_MAIN_STATE_RUNNING {
	}
	// RUNNING means started, not that the shell has set its trap yet: wait for it.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(filepath.Join(dir, "trapped")); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	var last *agentv1.StatusResponse
	for watch.Receive() {
		last = watch.Msg()
	}
	if err := watch.Err(); err != nil {
		t.Errorf("watch: %v", err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 {
		t.Errorf("agent exit: %v", err)
	}
	if last == nil || last.State != agentv1.MainState_MAIN_STATE_STOPPED || last.GetExitCode() != 4 {
		t.Errorf("last status %v", last)
	}
	st, err := agent.ReadStatusFile(state)
	if err != nil || st.State != agentv1.MainState_MAIN_STATE_STOPPED || st.Reason != "Stopped" {
		t.Errorf("status.json %v %v", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(state, "logs", "main.log")); !strings.Contains(string(b), "term\n") {
		t.Errorf("log %q", b)
	}
}

func TestListenConfigCompleted(t *testing.T) {
	dir := sandboxDir(t)
	cfgPath := writeConfig(t, dir, &agentconfig.Config{Argv: []string{"true"}, Listen: "unix:" + filepath.Join(dir, "a.sock")})
	cmd := exec.Command(binary, "--config", cfgPath, "--state-dir", filepath.Join(dir, "run"), "--listen-fd=-1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	st, err := agent.ReadStatusFile(filepath.Join(dir, "run"))
	if err != nil || st.State != agentv1.MainState_MAIN_STATE_COMPLETED {
		t.Errorf("status %v %v", st, err)
	}
}

// TestPermissionDenied runs the agent as nobody, so file modes apply (root bypasses them).
func TestPermissionDenied(t *testing.T) {
	testenv.RequireRoot(t, "to switch to nobody")
	dir := sandboxDir(t)
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("x"), 0o600)
	locked := filepath.Join(dir, "locked")
	os.Mkdir(locked, 0o755)
	sock := filepath.Join(dir, "a.sock")
	cfgPath := writeConfig(t, dir, &agentconfig.Config{Argv: []string{"sleep", "1000"}, WorkingDir: dir, Listen: "unix:" + sock})
	cmd := exec.Command(binary, "--config", cfgPath, "--state-dir", filepath.Join(dir, "run"), "--listen-fd=-1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	c := client(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	for i := 0; i < 200; i++ { // wait for the socket
		if _, err = c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{})); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"read", func() error {
			_, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: secret}))
			return err
		}},
		{"write", func() error {
			_, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: filepath.Join(locked, "f"), Content: []byte("x")}))
			return err
		}},
	} {
		err := tc.call()
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var ce *connect.Error
		errors.As(err, &ce)
		found := false
		for _, d := range ce.Details() {
			if v, _ := d.Value(); v != nil {
				if info, ok := v.(*errdetails.ErrorInfo); ok && info.Reason == apierr.FilePermissionDenied && strings.HasPrefix(info.Metadata["filepath"], dir) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s: no ErrorInfo: %v", tc.name, err)
		}
	}
}
