package sbxcli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func TestParseContainer(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want sandbox.Container
		bad  string // a part of the error
	}{
		{in: "name=app,image=busybox", want: sandbox.Container{Name: "app", Image: "busybox"}},
		{in: "name=app,image=busybox:1.36,command=sleep,arg=3600,primary",
			want: sandbox.Container{Name: "app", Image: "busybox:1.36", Command: "sleep", Args: []string{"3600"}, Primary: true}},
		{in: `name=db,image=redis:7,"arg=a,b",arg=,arg=c,env=A=1=2,env=B=,cpu=250m,memory=64Mi,workdir=/data,primary=false`,
			want: sandbox.Container{Name: "db", Image: "redis:7", Args: []string{"a,b", "", "c"}, Env: map[string]string{"A": "1=2", "B": ""},
				CPU: "250m", Memory: "64Mi", WorkingDir: "/data"}},
		{in: "name=db,image=redis,probe=redis-cli ping,cmd=redis-server,primary=true",
			want: sandbox.Container{Name: "db", Image: "redis", Command: "redis-server", Primary: true,
				StartupProbe: &sandbox.Probe{Exec: []string{"/bin/sh", "-c", "redis-cli ping"}}}},

		{in: "", bad: "empty container"},
		{in: "  ", bad: "empty container"},
		{in: "image=busybox", bad: "name=NAME is required"},
		{in: "name=app", bad: "image=IMAGE is required"},
		{in: "name=App,image=x", bad: "DNS label"},
		{in: "name=-a,image=x", bad: "DNS label"},
		{in: "name=" + strings.Repeat("a", 64) + ",image=x", bad: "DNS label"},
		{in: "name=a,name=b,image=x", bad: "name given twice"},
		{in: "name=a,image=x,command=a,cmd=b", bad: "command given twice"},
		{in: "name=a,image=x,primary,primary", bad: "primary given twice"},
		{in: "name=a,image=x,primary=maybe", bad: "want true or false"},
		{in: "name=a,image=", bad: "image is empty"},
		{in: "name=a,image=x,,", bad: "empty field"},
		{in: "name=a,image=x,sleep", bad: `"sleep": want KEY=VALUE`},
		{in: "name=a,image=x,env=A", bad: "want env=KEY=VALUE"},
		{in: "name=a,image=x,env==1", bad: "want env=KEY=VALUE"},
		{in: "name=a,image=x,env=A=1,env=A=2", bad: "env A given twice"},
		{in: "name=a,image=x,cpu=lots", bad: "CPU quantity"},
		{in: "name=a,image=x,cpu=0", bad: "CPU quantity"},
		{in: "name=a,image=x,memory=-1Gi", bad: "a size"},
		{in: "name=a,image=x,gpu=1", bad: `unknown key "gpu"`},
		{in: `name=a,image=x,"arg=unterminated`, bad: "extraneous or missing"},
		{in: "name=a,image=x\nname=b,image=y", bad: "one line only"},
		{in: "name=a,image=" + strings.Repeat("x", maxContainerSpec), bad: "at most"},
	} {
		got, err := parseContainer(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("%q: err %v, want one with %q", tc.in, err, tc.bad)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseContainer(f *testing.F) {
	for _, s := range []string{"name=a,image=b", `name=a,image=b,"arg=x,y",env=K=V,primary`, "name=a,image=b,probe=true,cpu=1", ",,", `"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := parseContainer(s)
		if err == nil && (!dnsLabel.MatchString(c.Name) || c.Image == "") {
			t.Errorf("%q parsed into %+v", s, c)
		}
	})
}

// sbx run --container creates one sandbox of several containers, the primary marked,
// and runs CMD in the primary.
func TestSbxRunContainers(t *testing.T) {
	f := newFake(t)
	out, errs, code := f.sbx("", "run", "--tag", "multi",
		"--container", "name=app,image=busybox,command=sleep,arg=3600",
		"--container", `name=cache,image=redis:7,cpu=250m,memory=64Mi,"arg=--save,",env=A=1,probe=redis-cli ping,primary`,
		"--", "echo", "hi")
	if code != 0 || out != "hi\n" {
		t.Fatalf("run: exit %d, %q %q", code, out, errs)
	}
	sb, err := f.get("sbx-fake-1")
	if err != nil {
		t.Fatal(err)
	}
	cs := sb.GetSpec().GetContainers()
	if len(cs) != 2 || sb.GetSpec().GetTags()[0] != "multi" {
		t.Fatalf("spec %v", sb.GetSpec())
	}
	app, cache := cs[0], cs[1]
	if app.GetName() != "app" || app.GetImage() != "busybox" || app.GetCommand() != "sleep" || !slices.Equal(app.GetArgs(), []string{"3600"}) || app.Primary != nil {
		t.Errorf("app %v", app)
	}
	if cache.GetName() != "cache" || !cache.GetPrimary() || !slices.Equal(cache.GetArgs(), []string{"--save,"}) || cache.GetEnvironmentVariables()["A"] != "1" ||
		cache.GetResourceRequirements().GetLimits().GetCpu() != "250m" || cache.GetResourceRequirements().GetLimits().GetMemory() != "64Mi" ||
		!slices.Equal(cache.GetStartupProbe().GetExec(), []string{"/bin/sh", "-c", "redis-cli ping"}) {
		t.Errorf("cache %v", cache)
	}
	if !slices.Equal(f.execIn, []string{""}) {
		t.Errorf("CMD ran in %q, want the primary (no container on the wire)", f.execIn)
	}

	// Without primary the first container is; without CMD the ID goes to stdout.
	out, errs, code = f.sbx("", "run", "--container", "name=a,image=x", "--container", "name=b,image=y")
	if code != 0 || out != "sbx-fake-2\n" {
		t.Fatalf("run without CMD: %d %q %q", code, out, errs)
	}
	sb, _ = f.get("sbx-fake-2")
	if cs := sb.GetSpec().GetContainers(); !cs[0].GetPrimary() || cs[1].Primary != nil {
		t.Errorf("default primary %v", cs)
	}

	// One container still works with the old flags, unchanged.
	if _, errs, code := f.sbx("", "run", "-e", "A=1", "--cpu", "1", "busybox"); code != 0 {
		t.Fatalf("single container: %d %q", code, errs)
	}
	sb, _ = f.get("sbx-fake-3")
	if cs := sb.GetSpec().GetContainers(); len(cs) != 1 || cs[0].GetName() != "main" || cs[0].GetImage() != "busybox" || cs[0].GetEnvironmentVariables()["A"] != "1" {
		t.Errorf("single container %v", cs)
	}
}

// Bad --container use is a usage error naming what is wrong; nothing is created.
func TestSbxRunContainersRefused(t *testing.T) {
	f := newFake(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--container", "name=a"}, "image=IMAGE is required"},
		{[]string{"--container", "name=a,image=x,bogus=1"}, `unknown key "bogus"`},
		{[]string{"--container", "name=a,image=x", "busybox"}, "no IMAGE argument"},
		{[]string{"--container", "name=a,image=x", "busybox", "--", "true"}, "no IMAGE argument"},
		{[]string{"--container", "name=a,image=x", "-e", "A=1"}, "--env sets the only container"},
		{[]string{"--container", "name=a,image=x", "--cpu", "1"}, "--cpu sets the only container"},
		{[]string{"--container", "name=a,image=x", "--main", "sleep 1"}, "(command=EXE,arg=ARG…)"},
		{[]string{"--container", "name=a,image=x", "--container", "name=a,image=y"}, `two containers are named "a"`},
		{[]string{"--container", "name=a,image=x,primary", "--container", "name=b,image=y,primary"}, "a, b are all marked primary"},
		{[]string{}, "requires at least 1 arg"},
	} {
		_, errs, code := f.sbx("", append([]string{"run"}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) || !strings.Contains(errs, "Run 'sbx run --help' for usage.") {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errs, tc.want)
		}
	}
	if len(f.order) != 0 {
		t.Errorf("created %v", f.order)
	}
}

func TestSbxComposeUp(t *testing.T) {
	f := newFake(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "compose.yaml")
	compose := "services:\n  app:\n    image: app\n  redis:\n    image: redis\n"
	if err := os.WriteFile(file, []byte(compose), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := f.sbx("", "compose", "up", "-f", file, "--primary", "redis", "--image", "redis=redis:7", "--image", "app=busybox",
		"--cpu", "500m", "--memory", "128Mi", "--lifetime", "1h", "--tag", "c", "--name", "demo", "--deny-egress")
	if code != 0 || out != "sbx-fake-1\n" || !strings.Contains(errs, "keeps running") {
		t.Fatalf("compose up: %d %q %q", code, out, errs)
	}
	m := f.fromFile[0]
	if m.GetType() != sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE || string(m.GetContents()) != compose || m.GetPrimaryService() != "redis" ||
		!reflect.DeepEqual(m.GetImageOverrides(), map[string]string{"redis": "redis:7", "app": "busybox"}) ||
		m.GetDefaultResources().GetRequests().GetCpu() != "500m" || m.GetDefaultResources().GetLimits().GetMemory() != "128Mi" ||
		m.GetMaxLifetimeSeconds() != 3600 || m.GetTags()[0] != "c" || m.GetDisplayName() != "demo" || !m.GetNetwork().GetDenyEgress() ||
		m.GetControl() != sandboxv1.Control_CONTROL_UNSPECIFIED || m.GetRequestId() == "" {
		t.Errorf("request %v", m)
	}

	// From stdin, in engine mode, as JSON: the sandbox with its containers.
	out, errs, code = f.sbx(compose, "compose", "up", "-f", "-", "--engine", "-o", "json")
	if code != 0 || string(f.fromFile[1].GetContents()) != compose || f.fromFile[1].GetControl() != sandboxv1.Control_CONTROL_CONTAINER_ENGINE {
		t.Fatalf("compose up from stdin: %d %q", code, errs)
	}
	var sb struct {
		SandboxID string `json:"sandboxId"`
		Spec      struct {
			Containers []struct{ Name string } `json:"containers"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.SandboxID != "sbx-fake-2" || len(sb.Spec.Containers) != 2 {
		t.Errorf("json %v %q", err, out)
	}

	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, sandbox.MaxSandboxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"compose", "up"}, `required flag(s) "file" not set`},
		{[]string{"compose", "up", "-f", big}, "larger than 256 KiB"},
		{[]string{"compose", "up", "-f", empty}, "is empty"},
		{[]string{"compose", "up", "-f", filepath.Join(dir, "none.yaml")}, "no such file"},
		{[]string{"compose", "up", "-f", dir}, "not a regular file"},
		{[]string{"compose", "up", "-f", file, "--image", "redis"}, "want SERVICE=IMAGE"},
		{[]string{"compose", "up", "-f", file, "--image", "redis=a", "--image", "redis=b"}, `service "redis" given twice`},
		{[]string{"compose", "up", "-f", file, "extra"}, "unknown command"},
		{[]string{"compose", "down"}, `unknown command "down"`},
	} {
		if _, errs, code := f.sbx("", tc.args...); code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errs, tc.want)
		}
	}
	if len(f.fromFile) != 2 {
		t.Errorf("%d files sent, want 2", len(f.fromFile))
	}
}

// exec, sh, logs and every files subcommand send -c's container; without it, none (the
// primary).
func TestSbxContainerFlag(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	local := t.TempDir()
	if err := os.WriteFile(filepath.Join(local, "up.txt"), []byte("up"), 0o600); err != nil {
		t.Fatal(err)
	}
	remote := t.TempDir() // the fake's exec runs on this host: the "sandbox" path is local too
	for _, tc := range []struct {
		args []string
		in   string // the container the exec went to
	}{
		{[]string{"exec", "-c", "redis", "sbx-1", "--", "true"}, "redis"},
		{[]string{"exec", "sbx-1", "--", "true"}, ""},
		{[]string{"exec", "--container", "app", "sbx-1", "--", "true"}, "app"},
		{[]string{"sh", "-c", "redis", "--cmd", "true", "sbx-1"}, "redis"},
		{[]string{"files", "ls", "-c", "redis", "sbx-1", remote}, "redis"},
		{[]string{"files", "mkdir", "-c", "redis", "-p", "sbx-1", filepath.Join(remote, "d")}, "redis"},
		{[]string{"files", "rm", "-c", "redis", "-r", "sbx-1", filepath.Join(remote, "d")}, "redis"},
		{[]string{"files", "cp", "-c", "redis", filepath.Join(local, "up.txt"), "sbx-1:" + remote}, "redis"},
		{[]string{"cp", "-c", "cache", "sbx-1:" + filepath.Join(remote, "up.txt"), filepath.Join(local, "down.txt")}, "cache"},
	} {
		n := len(f.execIn)
		if _, errs, code := f.sbx("", tc.args...); code != 0 {
			t.Errorf("%v: exit %d %q", tc.args, code, errs)
			continue
		}
		if got := f.execIn[n:]; len(got) == 0 || got[len(got)-1] != tc.in {
			t.Errorf("%v: exec went to %q, want %q", tc.args, got, tc.in)
		}
	}
	if b, err := os.ReadFile(filepath.Join(local, "down.txt")); err != nil || string(b) != "up" {
		t.Errorf("copied back %q %v", b, err)
	}

	if _, errs, code := f.sbx("data", "files", "write", "-c", "redis", "sbx-1", "/f"); code != 0 {
		t.Fatalf("write: %d %q", code, errs)
	}
	if out, errs, code := f.sbx("", "files", "read", "--container", "redis", "sbx-1", "/f"); code != 0 || out != "data" {
		t.Errorf("read from redis: %d %q %q", code, out, errs)
	}
	if _, _, code := f.sbx("", "files", "read", "sbx-1", "/f"); code == 0 {
		t.Error("the primary has the file written to redis")
	}
	if want := []string{"write redis /f", "read redis /f", "read  /f"}; !slices.Equal(f.fileReqs, want) {
		t.Errorf("file calls %q, want %q", f.fileReqs, want)
	}

	out, errs, code := f.sbx("", "logs", "-c", "redis", "sbx-1")
	if code != 0 || out != "output of redis\n" {
		t.Errorf("logs -c: %d %q %q", code, out, errs)
	}
	if out, _, _ := f.sbx("", "logs", "--tail", "3", "sbx-1"); out != "output of the primary\n" || f.logReqs[1].GetTailLines() != 3 {
		t.Errorf("logs: %q", out)
	}
}

// get lists the containers of a multi-container sandbox (name, primary, image, state,
// exit code, restarts); JSON carries the spec's containers and their statuses.
func TestSbxGetListsContainers(t *testing.T) {
	f := newFake(t)
	f.put(&sandboxv1.Sandbox{SandboxId: "sbx-m", Spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Name: "app", Image: "busybox:1.36", Primary: boolPtr(true)}, {Name: "redis", Image: "redis:7"}, {Name: "later", Image: "x"}}},
		Status: &sandboxv1.SandboxStatus{State: sandboxv1.State_STATE_RUNNING, ContainerStatuses: []*sandboxv1.ContainerStatus{
			{Name: "app", State: sandboxv1.State_STATE_RUNNING, RestartCount: 0},
			{Name: "redis", State: sandboxv1.State_STATE_FAILED, ExitCode: 137, RestartCount: 3},
		}}})
	out, errs, code := f.sbx("", "get", "sbx-m")
	if code != 0 {
		t.Fatalf("get: %d %q", code, errs)
	}
	for _, re := range []string{
		`(?m)^Image:\s+busybox:1\.36$`,
		`(?m)^Containers:\nNAME\s+PRIMARY\s+IMAGE\s+STATE\s+EXIT\s+RESTARTS$`,
		`(?m)^app\s+yes\s+busybox:1\.36\s+running\s+-\s+0$`,
		`(?m)^redis\s+redis:7\s+failed\s+137\s+3$`,
		`(?m)^later\s+x\s+-\s+-\s+0$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get: no %s in\n%s", re, out)
		}
	}
	out, _, _ = f.sbx("", "get", "sbx-m", "-o", "json")
	var raw struct {
		Spec struct {
			Containers []struct {
				Name    string
				Primary bool
			} `json:"containers"`
		} `json:"spec"`
		Status struct {
			ContainerStatuses []struct {
				Name         string
				State        string
				ExitCode     int `json:"exitCode"`
				RestartCount int `json:"restartCount"`
			} `json:"containerStatuses"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw.Spec.Containers) != 3 || !raw.Spec.Containers[0].Primary ||
		len(raw.Status.ContainerStatuses) != 2 || raw.Status.ContainerStatuses[1].ExitCode != 137 || raw.Status.ContainerStatuses[1].RestartCount != 3 ||
		raw.Status.ContainerStatuses[1].State != "STATE_FAILED" {
		t.Errorf("get -o json: %v %+v\n%s", err, raw, out)
	}

	// A single-container sandbox keeps its short output.
	f.add("sbx-1")
	if out, _, _ := f.sbx("", "get", "sbx-1"); strings.Contains(out, "Containers:") {
		t.Errorf("single container lists containers:\n%s", out)
	}
}

func boolPtr(b bool) *bool { return &b }
