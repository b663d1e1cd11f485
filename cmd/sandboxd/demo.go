package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// demo brings up the single-host runtime and walks one sandbox through its life: create,
// exec, files, logs, delete. Until the gateway exists it drives the runner directly.
func demo(args []string) error {
	var cfg demoConfig
	if _, err := parseFlags("demo", &cfg, args); err != nil {
		return err
	}
	return cfg.run()
}

func (c demoConfig) run() error {
	ctx := context.Background()
	logger := newLogger(slog.LevelWarn, c.verbose)

	ref := c.image
	var insecureList []string
	if c.insecure != "" {
		insecureList = strings.Split(c.insecure, ",")
	}
	if ref == "" {
		host, stop, err := serveBusybox(ctx)
		if err != nil {
			return err
		}
		defer stop()
		ref = host + "/" + testimage.Busybox
		insecureList = append(insecureList, host)
		fmt.Printf("registry   serving %s on loopback\n", ref)
	}

	st, err := stack.NewLocal(ctx, stack.Config{DataDir: c.dataDir, InsecureRegistries: insecureList, Logger: logger})
	if err != nil {
		return err
	}
	defer st.Close()

	t0 := time.Now()
	sb, err := st.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: ref, Command: "/bin/sh", Args: []string{"-c", `echo "main command started in $(hostname)"; trap "exit 0" TERM; sleep infinity & wait`}, Env: map[string]string{"GREETING": "hello from sandboxd"}, Files: []runtime.File{{Path: "/work/README", Content: []byte("written at start-up\n")}}, Resources: runtime.Resources{
			MilliCPU:    1000,
			MemoryBytes: 256 << 20,
		}},
	}})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	fmt.Printf("create     %s accepted (%s)\n", sb.ID, sb.State)
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	agent, err := st.Runner.Agent(waitCtx, sb.ID, "")
	if err != nil {
		got, _ := st.Runner.Get(sb.ID)
		return fmt.Errorf("sandbox did not start: %w (%s: %s)", err, got.Reason, got.Message)
	}
	running, _ := st.Runner.Get(sb.ID)
	fmt.Printf("running    after %s, ip %s, runtime %s, image %s\n", time.Since(t0).Round(time.Millisecond), running.IP, running.RuntimeClass, short(running.ImageDigest))

	t1 := time.Now()
	res, err := agent.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", `echo "$GREETING"; id; cat /work/README`}}))
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	fmt.Printf("exec       exit %d in %s:\n%s", res.Msg.ExitCode, time.Since(t1).Round(time.Microsecond), indent(string(res.Msg.Stdout)))

	if _, err := agent.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: "/work/data.txt", Content: []byte("round trip\n")})); err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	file, err := agent.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: "/work/data.txt"}))
	if err != nil {
		return fmt.Errorf("read file: %w", err)
	}
	fmt.Printf("files      wrote and read /work/data.txt: %q\n", file.Msg.Content)

	logs, err := agent.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
	if err != nil {
		return fmt.Errorf("logs: %w", err)
	}
	fmt.Print("logs       ")
	for logs.Receive() {
		fmt.Print(string(logs.Msg().Data))
	}
	if err := logs.Err(); err != nil {
		return fmt.Errorf("logs: %w", err)
	}

	t2 := time.Now()
	if _, err := st.Runner.Delete(sb.ID, 10*time.Second); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	end, err := st.Runner.WaitTerminal(waitCtx, sb.ID)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	fmt.Printf("delete     %s in %s\n", end.State, time.Since(t2).Round(time.Millisecond))
	if end.State != runner.StateTerminated {
		return fmt.Errorf("sandbox ended %s (%s), want TERMINATED", end.State, end.Message)
	}
	fmt.Println("ok         the single-host runtime works; `make test` runs every test")
	return nil
}

// serveBusybox serves the busybox test image (scripts/build-test-images.sh builds its
// rootfs) from a registry on loopback.
func serveBusybox(ctx context.Context) (string, func(), error) {
	tarball := filepath.Join(testimage.Dir(), "busybox.tar")
	img, err := testimage.Build(tarball, image.Config{Cmd: []string{"/bin/sh"}, Env: []string{testimage.DefaultPath}})
	if err != nil {
		return "", nil, fmt.Errorf("busybox test image: %w (build it with %s)", err, testimage.Script)
	}
	host, stop, err := testimage.StartRegistry(ctx)
	if err != nil {
		return "", nil, err
	}
	if _, err := testimage.Push(host, testimage.Busybox, img); err != nil {
		stop()
		return "", nil, err
	}
	return host, stop, nil
}

func short(digest string) string {
	if len(digest) > 19 {
		return digest[:19]
	}
	return digest
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "           " + strings.Join(lines, "\n           ") + "\n"
}
