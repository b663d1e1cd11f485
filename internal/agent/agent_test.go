package agent

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// Tests run the agent in-process on a unix socket. The agent's reaper waits for every
// child of this process, so these tests must not use os/exec.

type harness struct {
	client   agentv1connect.AgentServiceClient
	stateDir string
	workDir  string
	stop     context.CancelFunc
	result   chan int
}

func startAgent(t testing.TB, cfg *agentconfig.Config, tweak ...func(*Options)) *harness {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "agt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	stateDir := filepath.Join(base, "run")
	if cfg.WorkingDir == "" {
		cfg.WorkingDir = filepath.Join(base, "work")
		if err := os.MkdirAll(cfg.WorkingDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Env == nil {
		cfg.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SANDBOX=1"}
	}
	opts := Options{Config: cfg, StateDir: stateDir, Listener: ln, BackoffStart: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
	for _, f := range tweak {
		f(&opts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{stateDir: stateDir, workDir: cfg.WorkingDir, stop: cancel, result: make(chan int, 1)}
	go func() {
		code, err := Run(ctx, opts)
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		h.result <- code
	}()
	h.client = NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.result:
		case <-time.After(10 * time.Second):
			t.Errorf("agent did not exit after stop")
		}
	})
	return h
}

// wait returns the agent's exit code.
func (h *harness) wait(t testing.TB) int {
	t.Helper()
	select {
	case code := <-h.result:
		h.result <- code
		return code
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not exit")
		return -1
	}
}

func (h *harness) statusFile(t testing.TB) *agentv1.StatusResponse {
	t.Helper()
	st, err := ReadStatusFile(h.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (h *harness) logText(t testing.TB) string {
	t.Helper()
	r, err := logstore.OpenReader(filepath.Join(h.stateDir, agentconfig.LogsDir), agentconfig.MainLog)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var b bytes.Buffer
	if _, err := r.Read(logstore.ReadOptions{}, func(c logstore.Chunk) error { b.Write(c.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func longMain() *agentconfig.Config {
	return &agentconfig.Config{Argv: []string{"sleep", "1000"}}
}

func TestMainCommand(t *testing.T) {
	tests := []struct {
		name         string
		argv         []string
		limit        int
		wantCode     int
		wantState    agentv1.MainState
		wantReason   string
		wantRestarts int32
		wantExit     *int32
		wantLog      string
		wantMsg      string
	}{
		{name: "completed", argv: []string{"sh", "-c", "echo out; echo err >&2"}, limit: 3,
			wantState: agentv1.MainState_MAIN_STATE_COMPLETED, wantReason: ReasonCompleted, wantExit: ptr(int32(0)), wantLog: "out\nerr\n"},
		{name: "restart limit", argv: []string{"sh", "-c", "echo run; exit 3"}, limit: 2, wantCode: 3,
			wantState: agentv1.MainState_MAIN_STATE_FAILED, wantReason: ReasonRestartLimit, wantRestarts: 2, wantExit: ptr(int32(3)),
			wantLog: "run\nrun\nrun\n", wantMsg: "exited with code 3"},
		{name: "no restarts", argv: []string{"false"}, limit: 0, wantCode: 1,
			wantState: agentv1.MainState_MAIN_STATE_FAILED, wantReason: ReasonRestartLimit, wantExit: ptr(int32(1))},
		{name: "signal", argv: []string{"sh", "-c", "kill -9 $$"}, limit: 1, wantCode: 137,
			wantState: agentv1.MainState_MAIN_STATE_FAILED, wantReason: ReasonRestartLimit, wantRestarts: 1, wantExit: ptr(int32(137)), wantMsg: "signal 9"},
		{name: "missing binary", argv: []string{"/no/such/binary"}, limit: 5, wantCode: 1,
			wantState: agentv1.MainState_MAIN_STATE_FAILED, wantReason: ReasonStartError, wantMsg: "no such file or directory"},
		{name: "not in PATH", argv: []string{"no-such-command-xyz"}, limit: 5, wantCode: 1,
			wantState: agentv1.MainState_MAIN_STATE_FAILED, wantReason: ReasonStartError, wantMsg: "not found"},
		{name: "not executable", argv: []string{"/etc/passwd"}, limit: 5, wantCode: 1,
			wantState: agentv1.MainState_MAIN_STATE_FAILED, wantReason: ReasonStartError, wantMsg: "permission denied"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := startAgent(t, &agentconfig.Config{Argv: tc.argv, RestartLimit: tc.limit})
			if code := h.wait(t); code != tc.wantCode {
				t.Errorf("agent exit code = %d, want %d", code, tc.wantCode)
			}
			st := h.statusFile(t)
			if st.State != tc.wantState || st.Reason != tc.wantReason || st.RestartCount != tc.wantRestarts {
				t.Errorf("status = %v", st)
			}
			if (st.ExitCode == nil) != (tc.wantExit == nil) || (st.ExitCode != nil && *st.ExitCode != *tc.wantExit) {
				t.Errorf("exit code = %v, want %v", st.ExitCode, tc.wantExit)
			}
			if !strings.Contains(st.Message, tc.wantMsg) {
				t.Errorf("message %q does not contain %q", st.Message, tc.wantMsg)
			}
			if st.FinishedAt == nil {
				t.Errorf("finished_at not set")
			}
			if tc.wantLog != "" {
				if got := h.logText(t); !sameLines(got, tc.wantLog) {
					t.Errorf("log = %q, want %q", got, tc.wantLog)
				}
			}
		})
	}
}

// sameLines compares ignoring the order of stdout and stderr lines within a run.
func sameLines(a, b string) bool {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

func ptr[T any](v T) *T { return &v }

func TestMainFilesEnvUser(t *testing.T) {
	testenv.RequireRoot(t, "switching to nobody")
	cfg := &agentconfig.Config{
		Argv: []string{"sh", "-c", `cat sub/dir/f.txt; echo " $GREETING $HOME $(id -u):$(id -g)"; stat -c %a sub/dir/f.txt`},
		Env:  []string{"PATH=/usr/bin:/bin", "GREETING=hi"},
		User: "nobody",
		Files: []agentconfig.File{
			{Path: "sub/dir/f.txt", Content: []byte("content"), Mode: 0o640},
		},
	}
	base := t.TempDir() // the user must reach the working dir
	os.Chmod(base, 0o755)
	os.Chmod(filepath.Dir(base), 0o755)
	cfg.WorkingDir = filepath.Join(base, "w")
	os.Mkdir(cfg.WorkingDir, 0o755)
	h := startAgent(t, cfg)
	if code := h.wait(t); code != 0 {
		t.Fatalf("exit %d: %s / %v", code, h.logText(t), h.statusFile(t))
	}
	if got, want := h.logText(t), "content hi /nonexistent 65534:65534\n640\n"; got != want {
		t.Errorf("log = %q, want %q", got, want)
	}
}

// TestMainMakesItsWorkingDir: a working dir the sandbox does not have yet is made
// before the main command starts (as container runtimes make a container's), and
// execs run in it too.
func TestMainMakesItsWorkingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "dir")
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", "pwd; exec sleep 60"}, WorkingDir: dir})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.client.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"pwd"}}))
	if err != nil || string(res.Msg.GetStdout()) != dir+"\n" {
		t.Fatalf("exec pwd: %v, %v; want %s", res, err, dir)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("working dir: %v, %v; want a directory, mode 0755", fi, err)
	}
}

// TestMainWorkingDirIsAFile: a working dir that cannot be made fails the start.
func TestMainWorkingDirIsAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h := startAgent(t, &agentconfig.Config{Argv: []string{"true"}, WorkingDir: file})
	if code := h.wait(t); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if st := h.statusFile(t); st.Reason != ReasonStartError || !strings.Contains(st.Message, "working directory") {
		t.Errorf("status = %v", st)
	}
}

func TestMainBadUser(t *testing.T) {
	h := startAgent(t, &agentconfig.Config{Argv: []string{"true"}, User: "no-such-user"})
	if code := h.wait(t); code != 1 {
		t.Errorf("exit %d", code)
	}
	if st := h.statusFile(t); st.Reason != ReasonStartError || !strings.Contains(st.Message, "no-such-user") {
		t.Errorf("status = %v", st)
	}
}

func TestResolveUser(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\napp:x:1001:\nextra:x:2000:app,other\nstaff:x:50:\n"), 0o644)
	tests := []struct {
		spec            string
		uid, gid        uint32
		groups          []uint32
		home            string
		wantErr, noCred bool
	}{
		{spec: "", noCred: true},
		{spec: "app", uid: 1000, gid: 1001, groups: []uint32{2000}, home: "/home/app"},
		{spec: "1000", uid: 1000, gid: 1001, groups: []uint32{2000}, home: "/home/app"},
		{spec: "4242", uid: 4242, gid: 0, home: "/"},
		{spec: "4242:77", uid: 4242, gid: 77, home: "/"},
		{spec: "app:staff", uid: 1000, gid: 50, home: "/home/app"},
		{spec: "ghost", wantErr: true},
		{spec: "app:ghost", wantErr: true},
	}
	for _, tc := range tests {
		u, err := resolveUser(tc.spec, root)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err = %v", tc.spec, err)
			continue
		}
		if err != nil || tc.noCred {
			if err == nil && u.cred != nil {
				t.Errorf("%q: cred %+v", tc.spec, u.cred)
			}
			continue
		}
		if os.Getuid() != 0 {
			continue
		}
		if u.cred == nil || u.cred.Uid != tc.uid || u.cred.Gid != tc.gid || !slices.Equal(u.cred.Groups, tc.groups) || u.home != tc.home {
			t.Errorf("%q: got %+v home %q", tc.spec, u.cred, u.home)
		}
	}
}

func TestStatusAndWatch(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	// Fails twice (restarts), then waits for the gate and exits 0.
	script := `n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; [ $n -ge 3 ] || exit 7; while [ ! -e ` + gate + ` ]; do sleep 0.02; done`
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", script}, RestartLimit: 6, WorkingDir: dir},
		func(o *Options) { o.BackoffStart = 150 * time.Millisecond })
	ctx := context.Background()
	stream, err := h.client.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var states []agentv1.MainState
	var last *agentv1.StatusResponse
	for stream.Receive() {
		last = stream.Msg()
		states = append(states, last.State)
		if last.State == agentv1.MainState_MAIN_STATE_RUNNING && last.RestartCount == 2 {
			st, err := h.client.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
			if err != nil || st.Msg.Pid == 0 || st.Msg.State != agentv1.MainState_MAIN_STATE_RUNNING {
				t.Errorf("Status = %v, %v", st, err)
			}
			if f := h.statusFile(t); f.Pid != st.Msg.Pid || f.RestartCount != 2 {
				t.Errorf("status.json = %v", f)
			}
			os.WriteFile(gate, nil, 0o644)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("watch ended with %v", err)
	}
	if last.State != agentv1.MainState_MAIN_STATE_COMPLETED || last.RestartCount != 2 || last.GetExitCode() != 0 {
		t.Errorf("final = %v (states %v)", last, states)
	}
	if !slices.Contains(states, agentv1.MainState_MAIN_STATE_RESTARTING) {
		t.Errorf("states %v lack RESTARTING", states)
	}
	if h.wait(t) != 0 {
		t.Error("agent exit code")
	}
}

func TestStop(t *testing.T) {
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", `trap 'echo got TERM; exit 5' TERM; echo ready; while :; do sleep 0.02; done`}, RestartLimit: 3})
	waitLog(t, h, "ready")
	h.stop()
	if code := h.wait(t); code != 5 {
		t.Errorf("exit %d", code)
	}
	st := h.statusFile(t)
	if st.State != agentv1.MainState_MAIN_STATE_STOPPED || st.Reason != ReasonStopped || st.GetExitCode() != 5 || st.RestartCount != 0 {
		t.Errorf("status = %v", st)
	}
	if !strings.Contains(h.logText(t), "got TERM") {
		t.Errorf("log = %q", h.logText(t))
	}
}

// waitRunning waits for the main command to run and returns its pid.
func waitRunning(t *testing.T, h *harness) int32 {
	t.Helper()
	stream, err := h.client.Watch(context.Background(), connect.NewRequest(&agentv1.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	for stream.Receive() {
		if st := stream.Msg(); st.State == agentv1.MainState_MAIN_STATE_RUNNING {
			return st.Pid
		}
	}
	t.Fatalf("watch ended: %v", stream.Err())
	return 0
}

func waitLog(t *testing.T, h *harness, s string) {
	t.Helper()
	stream, err := h.client.Logs(context.Background(), connect.NewRequest(&agentv1.LogsRequest{Follow: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var b []byte
	for stream.Receive() {
		b = append(b, stream.Msg().Data...)
		if bytes.Contains(b, []byte(s)) {
			return
		}
	}
	t.Fatalf("log ended without %q: %q (%v)", s, b, stream.Err())
}

func TestExec(t *testing.T) {
	h := startAgent(t, longMain())
	sub := filepath.Join(h.workDir, "sub")
	os.Mkdir(sub, 0o755)
	tests := []struct {
		name       string
		req        *agentv1.ExecRequest
		code       int32
		stdout     string
		stderr     string
		outTrunc   bool
		outProd    int64
		wantErr    connect.Code
		minElapsed time.Duration
		maxElapsed time.Duration
	}{
		{name: "stdout", req: &agentv1.ExecRequest{Command: []string{"echo", "hello"}}, stdout: "hello\n", outProd: 6},
		{name: "stderr and code", req: &agentv1.ExecRequest{Command: []string{"sh", "-c", "echo oops >&2; exit 42"}}, code: 42, stderr: "oops\n"},
		{name: "env overlay", req: &agentv1.ExecRequest{Command: []string{"sh", "-c", `echo $SANDBOX $EXTRA`}, Env: map[string]string{"EXTRA": "x", "SANDBOX": "2"}}, stdout: "2 x\n"},
		{name: "sandbox env", req: &agentv1.ExecRequest{Command: []string{"sh", "-c", `echo $SANDBOX`}}, stdout: "1\n"},
		{name: "default cwd", req: &agentv1.ExecRequest{Command: []string{"pwd"}}, stdout: h.workDir + "\n"},
		{name: "relative cwd", req: &agentv1.ExecRequest{Command: []string{"pwd"}, WorkingDir: "sub"}, stdout: sub + "\n"},
		{name: "absolute cwd", req: &agentv1.ExecRequest{Command: []string{"pwd"}, WorkingDir: "/"}, stdout: "/\n"},
		{name: "stdin", req: &agentv1.ExecRequest{Command: []string{"tr", "a-z", "A-Z"}, Stdin: []byte("abc")}, stdout: "ABC"},
		{name: "truncated", req: &agentv1.ExecRequest{Command: []string{"sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x"}, MaxOutputBytes: 10},
			stdout: "xxxxxxxxxx", outTrunc: true, outProd: 1000000},
		{name: "timeout kills group", req: &agentv1.ExecRequest{Command: []string{"sh", "-c", "sleep 30 & sleep 30; echo never"}, Timeout: durationpb.New(300 * time.Millisecond)},
			code: 137, minElapsed: 300 * time.Millisecond, maxElapsed: 2 * time.Second},
		{name: "signal", req: &agentv1.ExecRequest{Command: []string{"sh", "-c", "kill -TERM $$"}}, code: 143},
		{name: "not found", req: &agentv1.ExecRequest{Command: []string{"no-such-cmd"}}, code: 127, stderr: "sandbox-agent: no-such-cmd: command not found in PATH\n"},
		{name: "not executable", req: &agentv1.ExecRequest{Command: []string{"/etc/passwd"}}, code: 126, stderr: "sandbox-agent: /etc/passwd: permission denied\n"},
		{name: "missing cwd", req: &agentv1.ExecRequest{Command: []string{"true"}, WorkingDir: "/no/such/dir"}, code: 126, stderr: "sandbox-agent: working directory \"/no/such/dir\": no such file or directory\n"},
		{name: "empty command", req: &agentv1.ExecRequest{}, wantErr: connect.CodeInvalidArgument},
		{name: "traversal cwd", req: &agentv1.ExecRequest{Command: []string{"true"}, WorkingDir: "../x"}, wantErr: connect.CodeInvalidArgument},
		{name: "negative cap", req: &agentv1.ExecRequest{Command: []string{"true"}, MaxOutputBytes: -1}, wantErr: connect.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			res, err := h.client.Exec(context.Background(), connect.NewRequest(tc.req))
			elapsed := time.Since(start)
			if tc.wantErr != 0 {
				if connect.CodeOf(err) != tc.wantErr {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := res.Msg
			if r.ExitCode != tc.code || string(r.Stdout) != tc.stdout || (tc.stderr != "" && string(r.Stderr) != tc.stderr) {
				t.Errorf("got code %d stdout %q stderr %q", r.ExitCode, r.Stdout, r.Stderr)
			}
			if r.StdoutTruncated != tc.outTrunc || r.StderrTruncated {
				t.Errorf("truncated = %v/%v", r.StdoutTruncated, r.StderrTruncated)
			}
			if tc.outProd != 0 && r.StdoutBytesProduced != tc.outProd {
				t.Errorf("stdout produced = %d, want %d", r.StdoutBytesProduced, tc.outProd)
			}
			if elapsed < tc.minElapsed || (tc.maxElapsed > 0 && elapsed > tc.maxElapsed) {
				t.Errorf("took %v", elapsed)
			}
		})
	}
}

func TestExecLargeOutputDefaultCap(t *testing.T) {
	h := startAgent(t, longMain())
	res, err := h.client.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{
		Command: []string{"sh", "-c", "head -c 20000000 /dev/zero; head -c 300 /dev/zero >&2"}}))
	if err != nil {
		t.Fatal(err)
	}
	r := res.Msg
	if len(r.Stdout) != DefaultMaxOutputBytes || !r.StdoutTruncated || r.StdoutBytesProduced != 20000000 ||
		len(r.Stderr) != 300 || r.StderrTruncated || r.StderrBytesProduced != 300 {
		t.Errorf("len %d trunc %v produced %d; stderr %d %v %d", len(r.Stdout), r.StdoutTruncated, r.StdoutBytesProduced,
			len(r.Stderr), r.StderrTruncated, r.StderrBytesProduced)
	}
}

func TestExecClientCancelKills(t *testing.T) {
	h := startAgent(t, longMain())
	marker := filepath.Join(h.workDir, "pid")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := h.client.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", "echo $$ > " + marker + "; exec sleep 30"}}))
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("err = %v", err)
	}
	b, _ := os.ReadFile(marker)
	waitGone(t, strings.TrimSpace(string(b)))
}

// waitGone waits until /proc/<pid> disappears (killed and reaped).
func waitGone(t *testing.T, pid string) {
	t.Helper()
	if pid == "" || pid == "0" {
		t.Fatal("no pid")
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat("/proc/" + pid); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("process %s still exists", pid)
}

func TestZombiesReaped(t *testing.T) {
	h := startAgent(t, longMain())
	mainPid := strconv.Itoa(int(waitRunning(t, h)))
	for i := 0; i < 5; i++ {
		res, err := h.client.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", "sleep 0.1 & exit 0"}}))
		if err != nil || res.Msg.ExitCode != 0 {
			t.Fatal(res, err)
		}
	}
	// The orphaned sleeps are re-parented to this process (a child subreaper, like PID 1)
	// and must be reaped as they exit.
	deadline := time.Now().Add(3 * time.Second)
	for {
		z := zombieChildren(t)
		sleeps := slices.DeleteFunc(children(t, "sleep"), func(s string) bool { return strings.HasPrefix(s, mainPid+":") })
		if len(z) == 0 && len(sleeps) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombie children: %v, sleeps %v (main %s)", z, sleeps, mainPid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// children lists the pids of this process's children whose command is comm (any when "").
func children(t *testing.T, comm string) []string {
	return procChildren(t, func(c, state string) bool { return comm == "" || c == comm })
}

func zombieChildren(t *testing.T) []string {
	return procChildren(t, func(_, state string) bool { return state == "Z" })
}

func procChildren(t *testing.T, match func(comm, state string) bool) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := os.Getpid()
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		comm := s[strings.IndexByte(s, '(')+1 : i]
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(me) {
			continue
		}
		if match(comm, f[0]) {
			out = append(out, e.Name()+":"+comm+":"+f[0])
		}
	}
	return out
}

// TestExecWaitsForSpecFiles: the agent answers before it has written the spec's files
// (they are written as the main command first starts); an exec or a file read that
// comes in between waits for them rather than miss them.
func TestExecWaitsForSpecFiles(t *testing.T) {
	dir := t.TempDir()
	slow := func() { time.Sleep(300 * time.Millisecond) }
	testBeforeFiles.Store(&slow)
	defer testBeforeFiles.Store(nil)
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", "exec sleep 60"}, WorkingDir: dir,
		Files: []agentconfig.File{{Path: "spec.txt", Content: []byte("from the spec")}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.client.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat", "spec.txt"}}))
	if err != nil || string(res.Msg.GetStdout()) != "from the spec" {
		t.Fatalf("exec right after start: %v, %v; want the spec's file", res, err)
	}
	rf, err := h.client.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: filepath.Join(dir, "spec.txt")}))
	if err != nil || string(rf.Msg.GetContent()) != "from the spec" {
		t.Fatalf("read: %v, %v", rf, err)
	}
}

// TestTerminationLog: an agent given a termination log leaves its final status there as
// it ends (the Kubernetes backend reads a sidecar's restarts and exit from it); a
// symlink there is not followed, and a missing file is not made.
func TestTerminationLog(t *testing.T) {
	dir := t.TempDir()
	term := filepath.Join(dir, "termination-log")
	if err := os.WriteFile(term, []byte("stale"), 0o666); err != nil {
		t.Fatal(err)
	}
	h := startAgent(t, &agentconfig.Config{Argv: []string{"sh", "-c", "exit 7"}, RestartLimit: 2},
		func(o *Options) { o.TerminationLog = term })
	if code := h.wait(t); code != 7 {
		t.Fatalf("exit %d, want 7", code)
	}
	b, err := os.ReadFile(term)
	if err != nil {
		t.Fatal(err)
	}
	var st agentv1.StatusResponse
	if err := protojson.Unmarshal(b, &st); err != nil {
		t.Fatalf("termination log %q: %v", b, err)
	}
	if st.GetState() != agentv1.MainState_MAIN_STATE_FAILED || st.GetRestartCount() != 2 || st.GetExitCode() != 7 || st.GetReason() != ReasonRestartLimit {
		t.Errorf("termination log %v: want FAILED, exit 7 after 2 restarts", &st)
	}
	if bytes.Contains(b, []byte("\n")) {
		t.Errorf("termination log %q: want one line", b)
	}

	// A status too long for the kubelet's 4 KiB (a start error quoting a long command):
	// written with its message clipped, and nothing the workload wrote stays.
	if err := os.WriteFile(term, []byte(`{"state":"MAIN_STATE_COMPLETED"}`), 0o666); err != nil {
		t.Fatal(err)
	}
	// Control bytes (six each in JSON) and invalid UTF-8 (which protojson refuses) in it.
	h = startAgent(t, &agentconfig.Config{Argv: []string{"/nonexistent/" + strings.Repeat("\x01\xff", 2500)}},
		func(o *Options) { o.TerminationLog = term })
	h.wait(t)
	b, err = os.ReadFile(term)
	if err != nil {
		t.Fatal(err)
	}
	st.Reset()
	if err := protojson.Unmarshal(b, &st); err != nil || len(b) > 4096 || st.GetState() != agentv1.MainState_MAIN_STATE_FAILED || st.GetReason() != ReasonStartError {
		t.Errorf("termination log of a long start error (%d bytes) %v, %v: want the FAILED StartError status within 4 KiB", len(b), &st, err)
	}

	// A symlink in its place: the target is left alone.
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o666); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, p := range []string{link, missing} {
		h := startAgent(t, &agentconfig.Config{Argv: []string{"true"}}, func(o *Options) { o.TerminationLog = p })
		h.wait(t)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("symlink target now %q: followed", b)
	}
	if _, err := os.Lstat(missing); !os.IsNotExist(err) {
		t.Errorf("missing termination log made: %v", err)
	}
}
