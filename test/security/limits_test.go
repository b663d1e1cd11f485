package security

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// The bounds these attacks probe (internal/gateway/limits.go, internal/runtime/limits.go).
// Spelled out here rather than imported: the suite checks what the server does, and a
// bound quietly changed there should fail here.
const (
	limTagLen         = 59
	limTags           = 100
	limAnnotations    = 100
	limAnnotationSize = 256 << 10
	limRequestID      = 128
	limArgs           = 4096
	limArgBytes       = 128<<10 - 1
	limEnvVars        = 1024
	limEnvKey         = 256
	limEnvBytes       = 128<<10 - 2
	limFiles          = 256
	limFilePath       = 1024
	limFileBytes      = 32 << 20
	limFilesBytes     = 64 << 20
)

// limClient is a Connect client of the public SandboxService with key, over HTTP/2
// without TLS (as the API serves it on loopback), so streams work too.
func limClient(d *Dev, key string) sandboxv1connect.SandboxServiceClient {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return sandboxv1connect.NewSandboxServiceClient(&http.Client{Transport: tr}, d.API, connect.WithInterceptors(connecttest.Bearer(key)), connect.WithSendMaxBytes(100<<20))
}

// limSpec is a busybox sandbox that sleeps.
func limSpec() *sandboxv1.SandboxSpec {
	return &sandboxv1.SandboxSpec{
		Containers:         []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "/bin/sh", Args: []string{"-c", "sleep 600"}}},
		MaxLifetimeSeconds: 600,
		Tags:               []string{"security-limits"},
	}
}

// limCreate creates a sandbox (deleted when the test ends) and returns its ID.
func limCreate(t *testing.T, c sandboxv1connect.SandboxServiceClient, req *sandboxv1.CreateSandboxRequest) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.CreateSandbox(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	return id
}

// limWaitRunning waits (up to 90 s) until sandbox id is RUNNING: its file mounts are in
// place and its main command started.
func limWaitRunning(t *testing.T, c sandboxv1connect.SandboxServiceClient, id string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		res, err := c.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		st := res.Msg.GetStatus()
		switch st.GetState() {
		case sandboxv1.State_STATE_RUNNING:
			return
		case sandboxv1.State_STATE_FAILED, sandboxv1.State_STATE_COMPLETED, sandboxv1.State_STATE_TERMINATED:
			t.Fatalf("sandbox %s is %s: %s", id, st.GetState(), st.GetStateReason())
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still %s after 90 s", id, st.GetState())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// limExec runs argv in sandbox id (waiting while it starts).
func limExec(t *testing.T, c sandboxv1connect.SandboxServiceClient, id string, argv ...string) (*sandboxv1.ExecResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: argv}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// limMustExec runs argv and wants exit 0.
func limMustExec(t *testing.T, c sandboxv1connect.SandboxServiceClient, id string, argv ...string) string {
	t.Helper()
	r, err := limExec(t, c, id, argv...)
	if err != nil || r.GetExitCode() != 0 {
		t.Fatalf("exec %q: %v (exit %d, stderr %q)", argv, err, r.GetExitCode(), r.GetStderr())
	}
	return string(r.GetStdout())
}

// limWantViolation wants INVALID_ARGUMENT with a field violation of field.
func limWantViolation(t *testing.T, what string, err error, field string) {
	t.Helper()
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("%s: %v, want INVALID_ARGUMENT", what, err)
		return
	}
	var got []string
	for _, v := range apierr.Violations(err) {
		if v.Field == field {
			return
		}
		got = append(got, v.Field)
	}
	t.Errorf("%s: violations of %q, want one of %q (%v)", what, got, field, err)
}

func limMany(n int, f func(i int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

// TestLimitCreateOverBounds: a create just over each bound is refused with a violation
// naming the field (before today's fix, 10,000 of each and a 100 KB tag were stored).
func TestLimitCreateOverBounds(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	const c0 = "sandbox.spec.containers[0]"
	envOf := func(n int, f func(i int) (string, string)) map[string]string {
		m := map[string]string{}
		for i := range n {
			k, v := f(i)
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		edit  func(r *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, c *sandboxv1.Container)
		field string
	}{
		{"request_id", func(r *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			r.RequestId = strings.Repeat("r", limRequestID+1)
		}, "request_id"},
		{"tag length", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Tags = []string{strings.Repeat("t", limTagLen+1)}
		}, "sandbox.spec.tags[0]"},
		{"tag of 100 KB", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Tags = []string{"ok", strings.Repeat("t", 100_000)}
		}, "sandbox.spec.tags[1]"},
		{"tag grammar", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Tags = []string{"ends-with-dash-"}
		}, "sandbox.spec.tags[0]"},
		{"tag count", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Tags = limMany(limTags+1, func(i int) string { return fmt.Sprint("t", i) })
		}, "sandbox.spec.tags"},
		{"annotation count", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Annotations = envOf(limAnnotations+1, func(i int) (string, string) { return fmt.Sprint("a", i), "v" })
		}, "sandbox.spec.annotations"},
		{"annotation size", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Annotations = map[string]string{"a": strings.Repeat("v", limAnnotationSize)}
		}, "sandbox.spec.annotations"},
		{"annotation key name", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Annotations = map[string]string{strings.Repeat("k", 64): ""}
		}, "sandbox.spec.annotations"},
		{"annotation key prefix", func(_ *sandboxv1.CreateSandboxRequest, s *sandboxv1.SandboxSpec, _ *sandboxv1.Container) {
			s.Annotations = map[string]string{strings.Repeat("p", 254) + "/k": ""}
		}, "sandbox.spec.annotations"},
		{"container name", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Name = "Not_A_Label"
		}, c0 + ".name"},
		{"container name length", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Name = strings.Repeat("a", 64)
		}, c0 + ".name"},
		{"env count", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.EnvironmentVariables = envOf(limEnvVars+1, func(i int) (string, string) { return fmt.Sprint("V", i), "" })
		}, c0 + ".environment_variables"},
		{"env name length", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.EnvironmentVariables = map[string]string{strings.Repeat("K", limEnvKey+1): ""}
		}, c0 + ".environment_variables"},
		{"env variable size", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.EnvironmentVariables = map[string]string{"A": strings.Repeat("v", limEnvBytes)}
		}, c0 + ".environment_variables[A]"},
		{"env total size", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.EnvironmentVariables = envOf(5, func(i int) (string, string) { return fmt.Sprint("V", i), strings.Repeat("v", limEnvBytes-2) })
		}, c0 + ".environment_variables"},
		{"env name with '='", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.EnvironmentVariables = map[string]string{"A=B": "c"}
		}, c0 + ".environment_variables"},
		{"args count", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Args = append([]string{"-c", "sleep 600"}, limMany(limArgs-2, func(int) string { return "x" })...) // with the command: one over
		}, c0 + ".args"},
		{"arg size", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Args = []string{"-c", "sleep 600", strings.Repeat("a", limArgBytes+1)}
		}, c0 + ".args[2]"},
		{"args total size", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Args = append([]string{"-c", "sleep 600"}, limMany(5, func(int) string { return strings.Repeat("a", limArgBytes-10) })...)
		}, c0 + ".args"},
		{"file count", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			for i := range limFiles + 1 {
				c.Files = append(c.Files, &sandboxv1.FileMount{Path: fmt.Sprint("/tmp/f/", i)})
			}
		}, c0 + ".files"},
		{"file path length", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Files = []*sandboxv1.FileMount{{Path: "/tmp" + strings.Repeat("/abc", (limFilePath-4)/4) + "x"}}
		}, c0 + ".files[0].path"},
		{"file size", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Files = []*sandboxv1.FileMount{{Path: "/tmp/big", Content: make([]byte, limFileBytes+1)}}
		}, c0 + ".files[0].content"},
		{"files total size", func(_ *sandboxv1.CreateSandboxRequest, _ *sandboxv1.SandboxSpec, c *sandboxv1.Container) {
			c.Files = []*sandboxv1.FileMount{{Path: "/tmp/a", Content: make([]byte, limFileBytes)}, {Path: "/tmp/b", Content: make([]byte, limFilesBytes-limFileBytes)}, {Path: "/tmp/c", Content: []byte("x")}}
		}, c0 + ".files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := limSpec()
			r := &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: s}}
			tc.edit(r, s, s.Containers[0])
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := c.CreateSandbox(ctx, connect.NewRequest(r))
			if err == nil {
				id := res.Msg.GetSandboxId()
				_, _ = c.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
			}
			limWantViolation(t, tc.name, err, tc.field)
		})
	}
}

// TestLimitCreateAtBounds: a sandbox with every count and size at its bound at once is
// created, runs, and keeps what it was given.
func TestLimitCreateAtBounds(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	s := limSpec()
	ct := s.Containers[0]
	ct.Name = strings.Repeat("m", 63)
	s.Tags = limMany(limTags, func(i int) string { return fmt.Sprintf("%s%03d", strings.Repeat("T", limTagLen-3), i) })
	s.Annotations = map[string]string{}
	for i := range limAnnotations - 2 {
		s.Annotations[fmt.Sprint("a", i)] = "v"
	}
	s.Annotations[strings.Repeat("p", 253)+"/"+strings.Repeat("n", 63)] = ""
	used := 0
	for k, v := range s.Annotations {
		used += len(k) + len(v)
	}
	s.Annotations["big"] = strings.Repeat("v", limAnnotationSize-used-len("big"))
	ct.EnvironmentVariables = map[string]string{"BIG": strings.Repeat("v", limEnvBytes-len("BIG")), strings.Repeat("K", limEnvKey): "k"}
	for i := range limEnvVars - 2 {
		ct.EnvironmentVariables[fmt.Sprint("V", i)] = "v"
	}
	// With the command, args are at their count bound; one of them at the size bound.
	ct.Args = append([]string{"-c", "sleep 600", strings.Repeat("a", limArgBytes)}, limMany(limArgs-4, func(int) string { return "x" })...)
	for i := range limFiles - 1 {
		ct.Files = append(ct.Files, &sandboxv1.FileMount{Path: fmt.Sprint("/tmp/f/", i), Content: []byte("x")})
	}
	long := "/tmp" + strings.Repeat("/abc", (limFilePath-4)/4)
	ct.Files = append(ct.Files, &sandboxv1.FileMount{Path: long, Content: []byte("deep")})
	id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: s}, RequestId: strings.Repeat("r", limRequestID)})
	limWaitRunning(t, c, id)

	if out := limMustExec(t, c, id, "cat", long); out != "deep" {
		t.Errorf("file at the path-length bound: %q", out)
	}
	if out := limMustExec(t, c, id, "sh", "-c", `echo ${#BIG}`); strings.TrimSpace(out) != fmt.Sprint(limEnvBytes-len("BIG")) {
		t.Errorf("env variable at the size bound: length %q", out)
	}
	got, err := c.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Msg.GetSpec().GetTags(), s.Tags) || len(got.Msg.GetSpec().GetAnnotations()) != limAnnotations {
		t.Errorf("stored %d tags, %d annotations; want %d, %d", len(got.Msg.GetSpec().GetTags()), len(got.Msg.GetSpec().GetAnnotations()), limTags, limAnnotations)
	}
}

// TestLimitFileMountReservedPath: file mounts into the agent's directory are refused at
// create (a mount at /.sandboxd/run/agent.sock used to leave the sandbox CREATING).
func TestLimitFileMountReservedPath(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	for _, p := range []string{"/.sandboxd/run/agent.sock", "/.sandboxd/config.json", "/.sandboxd", "//.sandboxd//bin/sandbox-agent"} {
		s := limSpec()
		s.Containers[0].Files = []*sandboxv1.FileMount{{Path: "/tmp/ok", Content: []byte("ok")}, {Path: p, Content: []byte("x")}}
		_, err := c.CreateSandbox(context.Background(), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: s}}))
		limWantViolation(t, "file mount at "+p, err, "sandbox.spec.containers[0].files[1].path")
	}
}

// TestExecLimits: NUL bytes in argv or env and bad env names are INVALID_ARGUMENT with a
// violation (they used to run and exit 126); counts and sizes have the create bounds.
func TestExecLimits(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: limSpec()}})
	limMustExec(t, c, id, "true") // running
	for _, tc := range []struct {
		name  string
		argv  []string
		env   map[string]string
		field string
	}{
		{"NUL in argv", []string{"echo", "a\x00b"}, nil, "command[1]"},
		{"NUL in argv[0]", []string{"ec\x00ho"}, nil, "command[0]"},
		{"NUL in an env value", []string{"true"}, map[string]string{"A": "x\x00y"}, "env[A]"},
		{"NUL in an env name", []string{"true"}, map[string]string{"A\x00": "x"}, "env"},
		{"'=' in an env name", []string{"true"}, map[string]string{"A=B": "x"}, "env"},
		{"empty env name", []string{"true"}, map[string]string{"": "x"}, "env"},
		{"too many args", limMany(limArgs+1, func(int) string { return "true" }), nil, "command"},
		{"arg too large", []string{"echo", strings.Repeat("a", limArgBytes+1)}, nil, "command[1]"},
		{"too many env vars", []string{"true"}, func() map[string]string {
			m := map[string]string{}
			for i := range limEnvVars + 1 {
				m[fmt.Sprint("V", i)] = ""
			}
			return m
		}(), "env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Exec(context.Background(), connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: tc.argv, Env: tc.env}))
			limWantViolation(t, tc.name, err, tc.field)
		})
	}
	t.Run("stream exec NUL", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st := c.StreamExec(ctx)
		_ = st.Send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Init{Init: &sandboxv1.ExecStreamInit{SandboxId: id, Command: []string{"echo", "\x00"}}}})
		_ = st.CloseRequest()
		_, err := st.Receive()
		limWantViolation(t, "stream exec", err, "init.command[1]")
	})
	// At the bounds: as many arguments as allowed, one of the largest size.
	argv := append([]string{"true", strings.Repeat("a", limArgBytes)}, limMany(limArgs-2, func(int) string { return "x" })...)
	if r, err := limExec(t, c, id, argv...); err != nil || r.GetExitCode() != 0 {
		t.Errorf("exec at the argument bounds: %v (exit %d)", err, r.GetExitCode())
	}
}

// TestFileWriteReservedPath: WriteFile into the agent's directory is refused, and the
// agent keeps serving.
func TestFileWriteReservedPath(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: limSpec()}})
	before := limMustExec(t, c, id, "ls", "-a", "/.sandboxd/run")
	for _, p := range []string{"/.sandboxd/run/agent.sock", "/.sandboxd/run/status.json", "/.sandboxd/config.json", "//.sandboxd/run/x", "/tmp/../.sandboxd/x"} {
		_, err := c.WriteFile(context.Background(), connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: id, Path: p, Content: []byte("x")}))
		if strings.Contains(p, "..") {
			// Refused earlier, as every ".." is.
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("write %s: %v, want INVALID_ARGUMENT", p, err)
			}
			continue
		}
		limWantViolation(t, "write "+p, err, "path")
		if apierr.Reason(err) != apierr.InvalidPath {
			t.Errorf("write %s: reason %q, want %s", p, apierr.Reason(err), apierr.InvalidPath)
		}
	}
	// Relative to the working directory (/): the same directory.
	_, err := c.WriteFile(context.Background(), connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: id, Path: ".sandboxd/run/agent.sock", Content: []byte("x")}))
	limWantViolation(t, "write .sandboxd/run/agent.sock", err, "path")
	if after := limMustExec(t, c, id, "ls", "-a", "/.sandboxd/run"); after != before {
		t.Errorf("the agent's directory changed under the writes:\n%s\nnow:\n%s", before, after)
	}
}

// TestFileReadFIFO: ReadFile of a FIFO without a writer answers at once with a typed
// error, every time (it used to block until the deadline and leak an agent thread per
// call), and the sandbox keeps answering.
func TestFileReadFIFO(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: limSpec()}})
	limMustExec(t, c, id, "mkfifo", "/tmp/fifo")
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := c.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: id, Path: "/tmp/fifo"}))
		took := time.Since(start)
		cancel()
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.FileNotRegular {
			t.Fatalf("read %d: %v (reason %q), want FAILED_PRECONDITION %s", i, err, apierr.Reason(err), apierr.FileNotRegular)
		}
		if took > time.Second {
			t.Fatalf("read %d took %s", i, took)
		}
	}
	for _, p := range []string{"/dev/null", "/dev/zero"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: id, Path: p}))
		cancel()
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.FileNotRegular {
			t.Errorf("read %s: %v (reason %q), want FAILED_PRECONDITION %s", p, err, apierr.Reason(err), apierr.FileNotRegular)
		}
	}
	// No thread left behind: the agent has as many as an idle one.
	if out := limMustExec(t, c, id, "echo", "alive"); out != "alive\n" {
		t.Errorf("exec after the reads: %q", out)
	}
	out := limMustExec(t, c, id, "sh", "-c", `for p in /proc/[0-9]*; do [ "$(readlink $p/exe)" = /.sandboxd/bin/sandbox-agent ] && grep Threads $p/status; done | head -1`)
	var threads int
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "Threads: %d", &threads); err != nil || threads > 40 {
		t.Errorf("the agent has %q after 50 reads of a FIFO", out)
	}
}

// TestFileWriteBusyOrReadOnly: WriteFile to a bind-mounted file (/etc/hosts), a read-only
// filesystem or a directory is a typed file error, never INTERNAL.
func TestFileWriteBusyOrReadOnly(t *testing.T) {
	d := needDev(t)
	c := limClient(d, d.KeyA)
	id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: limSpec()}})
	limMustExec(t, c, id, "true")
	ro := limSpec()
	yes := true
	ro.Containers[0].SecurityContext = &sandboxv1.SecurityContext{ReadOnlyRootFilesystem: &yes}
	roID := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: ro}})
	limMustExec(t, c, roID, "true")
	for _, tc := range []struct {
		sandbox, path string
		codes         []connect.Code
		reasons       []string
	}{
		{id, "/etc/hosts", []connect.Code{connect.CodePermissionDenied, connect.CodeFailedPrecondition}, []string{apierr.FilePermissionDenied}},
		{id, "/etc/resolv.conf", []connect.Code{connect.CodePermissionDenied, connect.CodeFailedPrecondition}, []string{apierr.FilePermissionDenied}},
		{id, "/tmp", []connect.Code{connect.CodeFailedPrecondition}, []string{apierr.FileIsDirectory}},
		{roID, "/etc/new-file", []connect.Code{connect.CodePermissionDenied}, []string{apierr.FilePermissionDenied}},
		{roID, "/bin/sh", []connect.Code{connect.CodePermissionDenied}, []string{apierr.FilePermissionDenied}},
	} {
		_, err := c.WriteFile(context.Background(), connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: tc.sandbox, Path: tc.path, Content: []byte("x")}))
		if !slices.Contains(tc.codes, connect.CodeOf(err)) || !slices.Contains(tc.reasons, apierr.Reason(err)) {
			t.Errorf("write %s: %v (reason %q), want %v with %v", tc.path, err, apierr.Reason(err), tc.codes, tc.reasons)
		}
	}
	if out := limMustExec(t, c, id, "cat", "/etc/hosts"); strings.TrimSpace(out) == "x" {
		t.Errorf("/etc/hosts was replaced")
	}
}
