package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Options describe the backend under test to Run.
type Options struct {
	// Image has busybox (sh and its applets), a PATH in its config's environment, no
	// working dir in its config, and /bin/sh as its command.
	Image string
	// ImagePath is the PATH Image's config sets ("PATH=…").
	ImagePath string
	// WorkDirImage is Image with WorkDir, a directory in it, as its config's working dir;
	// "" skips the check of the image's working dir.
	WorkDirImage, WorkDir string
	// MissingImage is a well-formed reference to an image nobody has.
	MissingImage string
	// RuntimeClass is the class of every sandbox ("" = the backend's default).
	RuntimeClass string
	// StartTimeout bounds one Create; default 1 minute.
	StartTimeout time.Duration
	// StopLatency is how long a Stop may take beyond the grace period (and what a grace
	// period is rounded up to); default 2 seconds.
	StopLatency time.Duration
	// Parallel runs the tests in parallel: the states of different tests must not see
	// each other.
	Parallel bool
	// SecondImage, when set, runs the group tests (group.go, multi-container sandboxes):
	// an image other than Image with python3 and /bin/sh.
	SecondImage string
	// Destroyed, when set, checks that nothing of sandbox id is left on the host after
	// its Destroy (mounts, cgroups, files: what the backend knows to look for).
	Destroyed func(t *testing.T, b runtime.Backend, id string)
}

// Run tests that the Backends newBackend makes honour the runtime.Backend contract, the
// one the runner relies on: Create leaves the agent reachable, the sandbox sees the
// environment, working dir, hostname and files its spec and image give it, Wait tells
// how the main command ended, Stop forwards SIGTERM and kills after the grace period,
// Destroy is idempotent, a new Backend on the same state recovers live and ended
// sandboxes, and errors wrap the runtime's sentinels.
//
// newBackend(t) returns a Backend on state of t's own: the first call in a test makes
// that state (and removes it when t ends), a later call in the same test returns a new
// Backend on the same state, as a restarted runner makes it.
func Run(t *testing.T, newBackend func(t *testing.T) runtime.Backend, opts Options) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = time.Minute
	}
	if opts.StopLatency <= 0 {
		opts.StopLatency = 2 * time.Second
	}
	tests := []struct {
		name string
		fn   func(*testing.T, *suite)
	}{
		{"CreateReachesAgent", testCreateReachesAgent},
		{"Environment", testEnvironment},
		{"WorkingDir", testWorkingDir},
		{"Exit", testExit},
		{"Stop", testStop},
		{"Destroy", testDestroy},
		{"Recover", testRecover},
		{"Errors", testErrors},
		{"StartupProbe", testStartupProbe},
		{"Snapshot", testSnapshot},
	}
	if opts.SecondImage != "" {
		tests = append(tests, groupTests...)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &suite{opts: opts, newBackend: newBackend}
			s.parallel(t)
			tc.fn(t, s)
		})
	}
}

type suite struct {
	opts       Options
	newBackend func(*testing.T) runtime.Backend
}

func (s *suite) parallel(t *testing.T) {
	if s.opts.Parallel {
		t.Parallel()
	}
}

// id returns a new sandbox ID, short enough for every backend.
func id(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// spec is a sandbox of the suite's image running argv.
func (s *suite) spec(prefix string, argv ...string) runtime.Spec {
	sp := runtime.Spec{ID: id(prefix), Container: runtime.Container{Image: s.opts.Image}, RuntimeClass: s.opts.RuntimeClass}
	if len(argv) > 0 {
		sp.Command, sp.Args = argv[0], argv[1:]
	}
	return sp
}

// create creates spec on b and destroys it when t ends.
func (s *suite) create(t *testing.T, b runtime.Backend, spec runtime.Spec) runtime.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StartTimeout)
	defer cancel()
	t.Cleanup(func() { _ = b.Destroy(context.Background(), spec.ID) })
	info, err := b.Create(ctx, &spec)
	if err != nil {
		t.Fatalf("create %s: %v", spec.ID, err)
	}
	return info
}

// destroy destroys sandbox id and checks that nothing of it is left.
func (s *suite) destroy(t *testing.T, b runtime.Backend, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Destroy(ctx, id); err != nil {
		t.Fatalf("destroy %s: %v", id, err)
	}
	if s.opts.Destroyed != nil {
		s.opts.Destroyed(t, b, id)
	}
}

func wait(t *testing.T, b runtime.Backend, id string) runtime.Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ex, err := b.Wait(ctx, id)
	if err != nil {
		t.Fatalf("wait for %s: %v", id, err)
	}
	return ex
}

// agentOf is a client of sandbox id's agent, as the runner makes it.
func agentOf(b runtime.Backend, id string) agentv1connect.AgentServiceClient {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.DialAgent(ctx, id, "") })
}

// execIn runs argv in sandbox id and returns its stdout and exit code.
func execIn(t *testing.T, b runtime.Backend, id string, argv ...string) (string, int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := agentOf(b, id).Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: argv}))
	if err != nil {
		t.Fatalf("exec %q in %s: %v", argv, id, err)
	}
	return string(res.Msg.GetStdout()), res.Msg.GetExitCode()
}

func code(c *int32) any {
	if c == nil {
		return "none"
	}
	return *c
}

// testCreateReachesAgent: Create returns once the agent answers, with what the runner
// shows of the sandbox.
func testCreateReachesAgent(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.spec("reach", "sleep", "3600")
	before := time.Now()
	info := s.create(t, b, spec)
	if info.ID != spec.ID || info.RuntimeClass == "" || info.StartedAt.IsZero() || info.StartedAt.After(time.Now()) ||
		info.StartedAt.Before(before.Add(-time.Minute)) {
		t.Errorf("info %+v: want the sandbox's ID, its runtime class and when it started", info)
	}
	if s.opts.RuntimeClass != "" && info.RuntimeClass != s.opts.RuntimeClass {
		t.Errorf("runtime class %q, want %q", info.RuntimeClass, s.opts.RuntimeClass)
	}
	if out, c := execIn(t, b, spec.ID, "echo", "hi"); out != "hi\n" || c != 0 {
		t.Errorf("echo hi: %q, exit %d", out, c)
	}
	st, err := agentOf(b, spec.ID).Status(context.Background(), connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil || st.Msg.GetState() != agentv1.MainState_MAIN_STATE_RUNNING {
		t.Errorf("main command: %v, %v; want RUNNING", st, err)
	}
}

// testEnvironment: the main command and execs see the spec's environment over the
// image's, the sandbox's ID as hostname (also in /etc/hostname and /etc/hosts), and
// the spec's files, written before the main command started.
func testEnvironment(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.spec("env", "sh", "-c", `cat /data/note > /tmp/seen-by-main; env > /tmp/env-of-main; exec sleep 3600`)
	spec.Env = map[string]string{"GREETING": "hi there", "EMPTY": ""}
	spec.Files = []runtime.File{{Path: "/data/note", Content: []byte("note\n"), Mode: 0o640}}
	s.create(t, b, spec)

	checks := []struct {
		name string
		argv []string
		want string
	}{
		{"files before the main command", []string{"sh", "-c", "until [ -e /tmp/env-of-main ]; do sleep 0.05; done; cat /tmp/seen-by-main"}, "note\n"},
		{"file mode", []string{"stat", "-c", "%a", "/data/note"}, "640\n"},
		{"hostname", []string{"hostname"}, spec.ID + "\n"},
		{"/etc/hostname", []string{"cat", "/etc/hostname"}, spec.ID + "\n"},
		{"/etc/hosts names the hostname", []string{"sh", "-c", `grep -qw -- "` + spec.ID + `" /etc/hosts && echo yes`}, "yes\n"},
		{"exec env", []string{"sh", "-c", `echo "$GREETING|${EMPTY-unset}|$PATH"`}, "hi there||" + strings.TrimPrefix(s.opts.ImagePath, "PATH=") + "\n"},
		{"main command env", []string{"sh", "-c", `grep -E '^(GREETING|PATH)=' /tmp/env-of-main | sort`},
			"GREETING=hi there\n" + s.opts.ImagePath + "\n"},
		// The container runtime's HOSTNAME is not passed on (a shell may set its own).
		{"no HOSTNAME variable", []string{"sh", "-c", `env | grep -c '^HOSTNAME='; grep -c '^HOSTNAME=' /tmp/env-of-main`}, "0\n0\n"},
	}
	for _, c := range checks {
		if out, _ := execIn(t, b, spec.ID, c.argv...); out != c.want {
			t.Errorf("%s: %q, want %q", c.name, out, c.want)
		}
	}
}

// testWorkingDir: the main command and execs run in the spec's working dir, else the
// image's, else /; a working dir that does not exist yet is made.
func testWorkingDir(t *testing.T, s *suite) {
	b := s.newBackend(t)
	cases := []struct {
		name, image, dir, want string
	}{
		{"default", s.opts.Image, "", "/"},
		{"the spec's", s.opts.Image, "/tmp", "/tmp"},
		{"the spec's, made", s.opts.Image, "/work/dir", "/work/dir"},
		{"the image's", s.opts.WorkDirImage, "", s.opts.WorkDir},
		{"the spec's over the image's", s.opts.WorkDirImage, "/tmp", "/tmp"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.image == "" {
				t.Skip("no image with a working dir (Options.WorkDirImage)")
			}
			s.parallel(t)
			spec := s.spec("wd", "sh", "-c", "pwd > /tmp/pwd-of-main; exec sleep 3600")
			spec.Image, spec.WorkingDir = c.image, c.dir
			s.create(t, b, spec)
			if out, _ := execIn(t, b, spec.ID, "pwd"); out != c.want+"\n" {
				t.Errorf("exec: pwd %q, want %s", out, c.want)
			}
			out, _ := execIn(t, b, spec.ID, "sh", "-c", "until [ -s /tmp/pwd-of-main ]; do sleep 0.05; done; cat /tmp/pwd-of-main")
			if out != c.want+"\n" {
				t.Errorf("main command: pwd %q, want %s", out, c.want)
			}
		})
	}
}

// testExit: Wait tells how the main command ended: its last exit code, restarts and
// reason.
func testExit(t *testing.T, s *suite) {
	b := s.newBackend(t)
	cases := []struct {
		name     string
		argv     []string
		limit    int
		code     *int32
		restarts int
		reason   string
	}{
		{"exit 0", []string{"true"}, 0, ptr(int32(0)), 0, "Completed"},
		{"exit 3", []string{"sh", "-c", "exit 3"}, 0, ptr(int32(3)), 0, "RestartLimit"},
		{"restarts", []string{"sh", "-c", "exit 4"}, 2, ptr(int32(4)), 2, "RestartLimit"},
		{"cannot start", []string{"/nonexistent"}, 0, nil, 0, "StartError"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.parallel(t)
			spec := s.spec("exit", c.argv...)
			spec.RestartLimit = c.limit
			s.create(t, b, spec)
			ex := wait(t, b, spec.ID)
			if (ex.ExitCode == nil) != (c.code == nil) || ex.ExitCode != nil && *ex.ExitCode != *c.code ||
				ex.Restarts != c.restarts || ex.Reason != c.reason || ex.At.IsZero() {
				t.Errorf("exit %+v (code %v), want code %v, %d restarts, reason %s, a time", ex, code(ex.ExitCode), code(c.code), c.restarts, c.reason)
			}
			s.destroy(t, b, spec.ID)
		})
	}
}

// testStop: Stop forwards SIGTERM to the main command and returns once the container has
// exited; a main command that ignores it is killed when the grace period runs out.
func testStop(t *testing.T, s *suite) {
	b := s.newBackend(t)
	cases := []struct {
		name     string
		script   string
		grace    time.Duration
		min, max time.Duration
		code     *int32
		reason   string
	}{
		{"obeys SIGTERM", `trap "exit 0" TERM; touch /tmp/trapped; while true; do sleep 0.05; done`, 30 * time.Second, 0, s.opts.StopLatency, ptr(int32(0)), "Stopped"},
		{"ignores SIGTERM", `trap "" TERM; touch /tmp/trapped; while true; do sleep 0.05; done`, time.Second, time.Second, time.Second + s.opts.StopLatency, nil, "Killed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.parallel(t)
			spec := s.spec("stop", "sh", "-c", c.script)
			s.create(t, b, spec)
			execIn(t, b, spec.ID, "sh", "-c", "until [ -e /tmp/trapped ]; do sleep 0.05; done")
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := b.Stop(ctx, spec.ID, c.grace); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d < c.min || d > c.max {
				t.Errorf("stop took %v, want %v to %v", d, c.min, c.max)
			}
			ex := wait(t, b, spec.ID)
			if ex.Reason != c.reason || (ex.ExitCode == nil) != (c.code == nil) || ex.ExitCode != nil && *ex.ExitCode != *c.code {
				t.Errorf("exit %+v (code %v), want %s, code %v", ex, code(ex.ExitCode), c.reason, code(c.code))
			}
			// A second Stop of an ended sandbox returns at once.
			if err := b.Stop(ctx, spec.ID, time.Minute); err != nil {
				t.Errorf("stop of an ended sandbox: %v", err)
			}
			s.destroy(t, b, spec.ID)
		})
	}
}

// testDestroy: Destroy removes a running sandbox, after which it is not found, and is
// idempotent, also for a sandbox the backend never had.
func testDestroy(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.spec("destroy", "sleep", "3600")
	s.create(t, b, spec)
	s.destroy(t, b, spec.ID)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Destroy(ctx, spec.ID); err != nil {
		t.Errorf("second destroy: %v", err)
	}
	if err := b.Destroy(ctx, id("never")); err != nil {
		t.Errorf("destroy of a sandbox never created: %v", err)
	}
	if _, err := b.Wait(ctx, spec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("wait after destroy: %v, want ErrNotFound", err)
	}
	if _, err := b.DialAgent(ctx, spec.ID, ""); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("dial after destroy: %v, want ErrNotFound", err)
	}
	if err := b.Stop(ctx, spec.ID, time.Second); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("stop after destroy: %v, want ErrNotFound", err)
	}
}

// testRecover: a new Backend on the same state finds the live sandbox (with its spec,
// reachable, stoppable) and the ended one (with how it ended).
func testRecover(t *testing.T, s *suite) {
	b := s.newBackend(t)
	alive := s.spec("alive", "sleep", "3600")
	alive.Meta = map[string]string{"sandboxd.test": "kept"}
	ended := s.spec("ended", "sh", "-c", "exit 5")
	s.create(t, b, alive)
	s.create(t, b, ended)
	wait(t, b, ended.ID)

	b2 := s.newBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := b2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.Spec.ID)
	}
	slices.Sort(ids)
	if want := []string{alive.ID, ended.ID}; !slices.Equal(ids, slices.Sorted(slices.Values(want))) {
		t.Fatalf("recovered %v, want %v", ids, want)
	}
	for _, r := range recs {
		switch r.Spec.ID {
		case alive.ID:
			if !r.Alive || r.Exit != nil || r.Spec.Meta["sandboxd.test"] != "kept" || r.Spec.Image != alive.Image ||
				r.Spec.Command != "sleep" || r.Info.StartedAt.IsZero() || r.Info.RuntimeClass == "" {
				t.Errorf("live sandbox recovered as %+v (info %+v)", r.Spec, r.Info)
			}
		case ended.ID:
			if r.Alive || r.Exit == nil || r.Exit.ExitCode == nil || *r.Exit.ExitCode != 5 || r.Exit.Reason != "RestartLimit" {
				t.Errorf("ended sandbox recovered as alive %v, exit %+v", r.Alive, r.Exit)
			}
		}
	}
	if out, _ := execIn(t, b2, alive.ID, "echo", "still here"); out != "still here\n" {
		t.Errorf("exec after recover: %q", out)
	}
	if err := b2.Stop(ctx, alive.ID, 0); err != nil {
		t.Fatal(err)
	}
	if ex := wait(t, b2, alive.ID); ex.Reason == "" || ex.Reason == "Completed" {
		t.Errorf("exit after a stop: %+v", ex)
	}
	s.destroy(t, b2, alive.ID)
	s.destroy(t, b2, ended.ID)
}

// testErrors: what a backend cannot run fails Create with an error wrapping the
// runtime's sentinel for it, and leaves nothing behind.
func testErrors(t *testing.T, s *suite) {
	b := s.newBackend(t)
	cases := []struct {
		name string
		edit func(*runtime.Spec)
		want error
	}{
		{"image not found", func(sp *runtime.Spec) { sp.Image = s.opts.MissingImage }, runtime.ErrImageNotFound},
		{"invalid image reference", func(sp *runtime.Spec) { sp.Image = "Not A Reference" }, runtime.ErrInvalidImageRef},
		{"unknown runtime class", func(sp *runtime.Spec) { sp.RuntimeClass = "no-such-class" }, runtime.ErrUnknownRuntime},
		{"invalid ID", func(sp *runtime.Spec) { sp.ID = "Not_An_ID" }, runtime.ErrInvalidSpec},
		{"relative file path", func(sp *runtime.Spec) { sp.Files = []runtime.File{{Path: "etc/x"}} }, runtime.ErrInvalidSpec},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.parallel(t)
			spec := s.spec("err", "sleep", "3600")
			c.edit(&spec)
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.StartTimeout)
			defer cancel()
			_, err := b.Create(ctx, &spec)
			if !errors.Is(err, c.want) {
				_ = b.Destroy(context.Background(), spec.ID)
				t.Fatalf("create: %v, want %v", err, c.want)
			}
			if s.opts.Destroyed != nil && runtime.ValidID(spec.ID, 63) {
				s.opts.Destroyed(t, b, spec.ID)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
