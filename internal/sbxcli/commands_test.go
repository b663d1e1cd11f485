package sbxcli

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/version"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func TestSbxVersionAndCompletion(t *testing.T) {
	sbx := func(args ...string) (string, string, int) { return runSbx(context.Background(), "", args...) }
	if out, errs, code := sbx("--version"); code != 0 || out != "sbx "+version.String()+"\n" {
		t.Errorf("--version: %q %q %d", out, errs, code)
	}
	for shell, marker := range map[string]string{"bash": "complete -o default -F __start_sbx sbx", "zsh": "#compdef sbx", "fish": "complete -c sbx"} {
		if out, errs, code := sbx("completion", shell); code != 0 || !strings.Contains(out, marker) {
			t.Errorf("completion %s: exit %d, %q, stdout without %q", shell, code, errs, marker)
		}
	}
	if out, _, code := sbx("completion", "--help"); code != 0 || !strings.Contains(out, "source <(sbx completion bash)") {
		t.Errorf("completion --help does not say how to load it: %q", out)
	}
	if _, errs, code := sbx("completion", "tcsh"); code == 0 || !strings.Contains(errs, `unknown command "tcsh"`) {
		t.Errorf("completion tcsh: %d %q", code, errs)
	}
}

// Usage errors (unknown commands at any level, unknown flags, wrong arguments) exit
// non-zero and say where the usage is; a group without a subcommand shows its help.
func TestSbxUsageHints(t *testing.T) {
	f := newFake(t)
	for _, tc := range []struct {
		args []string
		hint string
	}{
		{[]string{"nosuch"}, "Run 'sbx --help' for usage."},
		{[]string{"files", "nosuch", "x"}, "Run 'sbx files --help' for usage."},
		{[]string{"admin", "runner", "nosuch"}, "Run 'sbx admin runner --help' for usage."},
		{[]string{"ls", "--nosuch"}, "Run 'sbx ls --help' for usage."},
		{[]string{"--nosuch", "ls"}, "Run 'sbx --help' for usage."},
		{[]string{"exec", "only-an-id"}, "Run 'sbx exec --help' for usage."},
	} {
		_, errs, code := f.sbx("", tc.args...)
		if code == 0 || !strings.HasPrefix(errs, "sbx: ") || !strings.HasSuffix(errs, tc.hint+"\n") {
			t.Errorf("%v: exit %d, stderr %q", tc.args, code, errs)
		}
	}
	if out, _, code := f.sbx("", "files"); code != 0 || !strings.Contains(out, "Available Commands:") {
		t.Errorf("files alone: %d %q", code, out)
	}
	// An error of the call itself gets no usage hint.
	if _, errs, _ := f.sbx("", "purge"); strings.Contains(errs, "--help") {
		t.Errorf("purge without a scope: %q", errs)
	}
}

// Without an endpoint sbx says how to name one and never picks a host by itself.
func TestSbxNoEndpoint(t *testing.T) {
	t.Setenv(sandbox.EnvBaseURL, "")
	t.Setenv(sandbox.EnvAPIKey, "k")
	for _, args := range [][]string{{"ls"}, {"get", "x"}, {"admin", "runner", "ls"}, {"purge", "--all"}} {
		_, errs, code := runSbx(context.Background(), "", args...)
		want := "sbx: no API endpoint: set CWSANDBOX_BASE_URL (sandboxd dev prints it) or --base-url\n"
		if code != 1 || errs != want {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
}

// runSbx runs sbx in-process with args only (no endpoint given).
func runSbx(ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int) {
	var out, errb strings.Builder
	code = ExecuteContext(ctx, args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

func TestSbxPurge(t *testing.T) {
	f := newFake(t)
	f.add("sbx-a1", "batch", "a")
	f.add("sbx-a2", "batch", "a")
	f.add("sbx-b1", "batch", "b")
	f.add("sbx-other")

	out, errs, code := f.sbx("", "purge", "--tag", "batch", "--tag", "a", "--dry-run")
	if code != 0 || out != "would stop 2 sandboxes\nsbx-a1\nsbx-a2\n" {
		t.Errorf("dry run: %d %q %q", code, out, errs)
	}
	if p := f.purges[len(f.purges)-1]; !p.GetDryRun() || !slices.Equal(p.GetTags(), []string{"batch", "a"}) || p.GetPurgeAll() {
		t.Errorf("dry run sent %v", p)
	}
	if list, _, _ := f.sbx("", "ls"); strings.Count(list, "running") != 4 {
		t.Errorf("a dry run stopped something:\n%s", list)
	}

	if out, errs, code := f.sbx("", "purge", "--tag", "a"); code != 0 || out != "stopped 2 sandboxes\n" {
		t.Errorf("purge --tag a: %d %q %q", code, out, errs)
	}
	if out, errs, code := f.sbx("", "purge", "--all", "--dry-run", "-o", "json"); code != 0 {
		t.Errorf("purge --all --dry-run -o json: %d %q", code, errs)
	} else {
		var got struct {
			DryRun bool     `json:"dry_run"`
			Count  int      `json:"purge_count"`
			IDs    []string `json:"sandbox_ids"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || !got.DryRun || got.Count != 2 || !slices.Equal(got.IDs, []string{"sbx-b1", "sbx-other"}) {
			t.Errorf("json %q: %+v %v", out, got, err)
		}
	}
	if out, _, code := f.sbx("", "purge", "--all"); code != 0 || out != "stopped 2 sandboxes\n" {
		t.Errorf("purge --all: %d %q", code, out)
	}
	n := len(f.purges)
	for _, args := range [][]string{{"purge"}, {"purge", "--all", "--tag", "x"}, {"purge", "--dry-run"}} {
		if _, errs, code := f.sbx("", args...); code != 1 || !strings.Contains(errs, "exactly one scope") {
			t.Errorf("%v: %d %q", args, code, errs)
		}
	}
	if len(f.purges) != n {
		t.Error("a purge without exactly one scope reached the API")
	}
}

// sbx exec and run exit with the command's code; 127 when it is not found; 128+signal
// (130 for Ctrl-C) when interrupted, which ends the command in the sandbox.
func TestSbxExitCodes(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	if out, _, code := f.sbx("", "exec", "sbx-1", "--", "sh", "-c", "echo out; exit 7"); code != 7 || out != "out\n" {
		t.Errorf("exec exit 7: %d %q", code, out)
	}
	if _, errs, code := f.sbx("", "exec", "sbx-1", "--", "no-such-command-xyz"); code != 127 || !strings.Contains(errs, "no-such-command-xyz: command not found") {
		t.Errorf("exec of a missing command: %d %q", code, errs)
	}
	if _, errs, code := f.sbx("", "run", "--rm", "busybox", "--", "no-such-command-xyz"); code != 127 || !strings.Contains(errs, "command not found") {
		t.Errorf("run of a missing command: %d %q", code, errs)
	}

	// Interrupted: the command in the sandbox sees its call end, sbx exits 130 (SIGINT)
	// or 143 (SIGTERM), and run --rm still deletes its sandbox.
	ended := make(chan struct{}, 4)
	f.exec = func(ctx context.Context, _ []string, _ io.Reader, stdout, _ io.Writer) (int32, string) {
		_, _ = stdout.Write([]byte("started\n"))
		<-ctx.Done()
		ended <- struct{}{}
		return 137, ""
	}
	interrupt := func(sig syscall.Signal, args ...string) (string, string, int) {
		ctx, cancel := context.WithCancelCause(context.Background())
		go func() {
			time.Sleep(300 * time.Millisecond)
			cancel(Interrupted{Signal: sig})
		}()
		out, errs, code := f.run(ctx, "", args...)
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Errorf("%v: the command in the sandbox did not end", args)
		}
		return out, errs, code
	}
	if out, errs, code := interrupt(syscall.SIGINT, "exec", "sbx-1", "--", "sleep", "60"); code != 130 || out != "started\n" || !strings.HasSuffix(errs, "sbx: interrupted\n") {
		t.Errorf("exec, Ctrl-C: %d %q %q", code, out, errs)
	}
	if _, _, code := interrupt(syscall.SIGTERM, "exec", "sbx-1", "--", "sleep", "60"); code != 143 {
		t.Errorf("exec, SIGTERM: %d", code)
	}
	_, errs, code := interrupt(syscall.SIGINT, "run", "--rm", "busybox", "--", "sleep", "60")
	if code != 130 || len(f.deleted) != 2 { // the earlier run --rm, and this one
		t.Errorf("run --rm, Ctrl-C: %d %q, deleted %v", code, errs, f.deleted)
	}
	// Without --rm the sandbox stays, and sbx says so.
	_, errs, code = interrupt(syscall.SIGINT, "run", "busybox", "--", "sleep", "60")
	if code != 130 || len(f.deleted) != 2 || !strings.Contains(errs, "keeps running until") {
		t.Errorf("run, Ctrl-C: %d %q, deleted %v", code, errs, f.deleted)
	}
}

// SignalContext turns a real SIGINT into a canceled context whose cause is the signal.
func TestSbxSignalContext(t *testing.T) {
	ctx, stop := SignalContext(context.Background())
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGINT did not cancel the context")
	}
	if got := interruptedCode(ctx); got != 130 {
		t.Errorf("exit code %d after SIGINT (cause %v), want 130", got, context.Cause(ctx))
	}
}

func TestSbxGetShowsResourcesExpiryAndEndpoints(t *testing.T) {
	f := newFake(t)
	created := time.Now().Add(-48 * time.Second)
	exit := int32(3)
	f.put(&sandboxv1.Sandbox{SandboxId: "sbx-1", Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}},
		Services: []*sandboxv1.Service{{Port: 8443, Endpoint: &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS,
			Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN}}},
	}, Status: &sandboxv1.SandboxStatus{
		State: sandboxv1.State_STATE_RUNNING, StateReason: "Restarted", ExitCode: &exit, CreateTime: timestamppb.New(created),
		EffectiveMaxLifetimeSeconds: 600,
		EffectiveResourceRequirements: &sandboxv1.ResourceRequirements{
			Requests: &sandboxv1.Resources{Cpu: "100m", Memory: "128Mi"},
			Limits:   &sandboxv1.Resources{Cpu: "1", Memory: "2040Mi"},
		},
		ContainerStatuses: []*sandboxv1.ContainerStatus{{Name: "main", RestartCount: 2}},
		Services: []*sandboxv1.ServiceStatus{
			{Port: 8080, Endpoint: &sandboxv1.EndpointStatus{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, Auth: sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN,
				Url: "https://8080-sbx-1.local.sandbox.localhost:8443"}},
			{Port: 8443, Endpoint: &sandboxv1.EndpointStatus{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, // auth from the spec
				Url: "https://8443-sbx-1.local.sandbox.localhost:8443"}},
		},
	}})
	out, errs, code := f.sbx("", "get", "sbx-1")
	if code != 0 {
		t.Fatalf("get: %d %q", code, errs)
	}
	expires := created.Add(600 * time.Second).Local().Format("2006-01-02 15:04:05 MST")
	for _, re := range []string{
		`(?m)^CPU:\s+100m CPU requested, limit 1 CPU$`,
		`(?m)^Memory:\s+128 MiB requested, limit 2 GiB$`,
		`(?m)^Restarts:\s+2$`,
		`(?m)^Reason:\s+Restarted$`,
		`(?m)^Exit code:\s+3$`,
		`(?m)^Lifetime:\s+10m$`,
		`(?m)^Expires:\s+` + regexp.QuoteMeta(expires) + ` \(in 9m1[12]s\)$`,
		`(?m)^Created:\s+.* \(4[89]s ago\)$`,
		`(?m)^8080/https\s+https://8080-sbx-1\.local\.sandbox\.localhost:8443\s+auth: open$`,
		`(?m)^8443/https\s+https://8443-sbx-1\.local\.sandbox\.localhost:8443\s+auth: share_token$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get: no %s in\n%s", re, out)
		}
	}
	// JSON keeps the API's raw values.
	out, _, _ = f.sbx("", "get", "sbx-1", "-o", "json")
	var raw struct {
		Status struct {
			EffectiveResourceRequirements struct {
				Limits struct{ Memory string } `json:"limits"`
			} `json:"effectiveResourceRequirements"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || raw.Status.EffectiveResourceRequirements.Limits.Memory != "2040Mi" {
		t.Errorf("get -o json: %v %q", err, out)
	}
}

func TestSbxHumanUnits(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	for _, tc := range []struct{ got, want string }{
		{humanBytes(512), "512 B"}, {humanBytes(1536), "1.5 KiB"}, {humanBytes(128 << 20), "128 MiB"},
		{humanBytes(2040 << 20), "2 GiB"}, {humanBytes(1932735283), "1.8 GiB"}, {humanBytes(1 << 30), "1 GiB"},
		{humanMemory("1Gi"), "1 GiB"}, {humanMemory("500M"), "477 MiB"}, {humanMemory("bogus"), "bogus"},
		{humanCPU("500m"), "500m CPU"}, {humanCPU("2"), "2 CPU"}, {humanCPU("1500m"), "1.5 CPU"}, {humanMilliCPU(1250), "1.25 CPU"},
		{humanDuration(552 * time.Second), "9m12s"}, {humanDuration(10 * time.Minute), "10m"}, {humanDuration(time.Hour), "1h"},
		{humanDuration(90*time.Minute + 400*time.Millisecond), "1h30m"}, {humanDuration(75 * time.Hour), "3d3h"}, {humanDuration(30 * 24 * time.Hour), "30d"},
		{humanDuration(0), "0s"},
		// Time left is cut down to the second, never rounded up: 19m59.6s is not "in 20m".
		{humanTime(now.Add(20*time.Minute-400*time.Millisecond), now), localTime(now.Add(20*time.Minute-time.Second)) + " (in 19m59s)"},
		{humanTime(now.Add(-3*time.Minute-600*time.Millisecond), now), localTime(now.Add(-3*time.Minute-time.Second)) + " (3m ago)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// sbx run without --rm prints the ID on stdout and on stderr (a buffer, not a terminal)
// until when the sandbox keeps running and how to stop it.
func TestSbxRunSaysItKeepsRunning(t *testing.T) {
	f := newFake(t)
	out, errs, code := f.sbx("", "run", "busybox")
	id := strings.TrimSpace(out)
	sb, err := f.get(id)
	if code != 0 || err != nil {
		t.Fatalf("run: %d %q %q %v", code, out, errs, err)
	}
	until := sb.GetStatus().GetCreateTime().AsTime().Add(600 * time.Second).Local().Format("2006-01-02 15:04:05 MST")
	if want := "sbx: sandbox " + id + " keeps running until " + until + " (stop it with: sbx stop " + id + ")\n"; errs != want {
		t.Errorf("run stderr %q, want %q", errs, want)
	}
	out, errs, code = f.sbx("", "run", "busybox", "--", "echo", "hi")
	if code != 0 || out != "hi\n" || !regexp.MustCompile(`^sbx: sandbox \S+ keeps running until .* \(stop it with: sbx stop \S+\)\n$`).MatchString(errs) {
		t.Errorf("run with a command: %d %q %q", code, out, errs)
	}
	if _, errs, _ := f.sbx("", "run", "--rm", "busybox", "--", "true"); errs != "" {
		t.Errorf("run --rm: stderr %q", errs)
	}
}

// sbx run prints the share token of a SHARE_TOKEN endpoint once, on stderr: the create
// response is the only place the API returns it (sbx get cannot show it later).
func TestSbxRunPrintsShareToken(t *testing.T) {
	f := newFake(t)
	out, errs, code := f.sbx("", "run", "--publish", "8080:https:token", "busybox")
	id := strings.TrimSpace(out)
	if want := "share token (shown only now; send it as header X-Sandbox-Share-Token): share-token-of-" + id + "\n"; code != 0 || !strings.Contains(errs, want) {
		t.Errorf("run --publish 8080:https:token: %d %q, want stderr with %q", code, errs, want)
	}
	if out, errs, _ := f.sbx("", "run", "--publish", "8080:https", "busybox"); strings.Contains(errs, "share token") {
		t.Errorf("an OPEN endpoint has no share token: %q %q", out, errs)
	}
	if out, _, _ := f.sbx("", "get", id); strings.Contains(out, "share-token-of-") {
		t.Errorf("sbx get shows a token the API never returns after create: %q", out)
	}
}

// sbx sh runs bash when the sandbox has it, else /bin/sh.
func TestSbxShellPicksBash(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	if _, errs, code := f.sbx("echo hi\n", "sh", "sbx-1"); code != 0 || !slices.Equal(f.lastExec(), autoShell) {
		t.Errorf("sh: %d %q, ran %q", code, errs, f.lastExec())
	}
	if _, _, code := f.sbx("", "sh", "sbx-1", "--cmd", "/bin/zsh"); code != 127 || !slices.Equal(f.lastExec(), []string{"/bin/zsh"}) {
		t.Errorf("sh --cmd: %d, ran %q", code, f.lastExec())
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash here")
	}
	shell := func(path string) string {
		cmd := exec.Command(autoShell[0], autoShell[1:]...)
		cmd.Env = []string{"PATH=" + path}
		cmd.Stdin = strings.NewReader("echo ${BASH_VERSION:-none}\n")
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := shell(strings.TrimSuffix(bash, "/bash")); got == "none" {
		t.Error("bash on the PATH, but the shell is not bash")
	}
	if got := shell(t.TempDir()); got != "none" {
		t.Errorf("no bash on the PATH, but the shell is bash %s", got)
	}
}
