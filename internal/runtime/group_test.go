package runtime_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestTotalResources(t *testing.T) {
	single := runtime.Spec{Container: runtime.Container{Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 1 << 20}}}
	if got := single.TotalResources(); got != single.Resources {
		t.Fatalf("single-container total %+v, want the container's own %+v", got, single.Resources)
	}
	r := func(cpu, mem, reqCPU, reqMem int64) runtime.Resources {
		return runtime.Resources{MilliCPU: cpu, MemoryBytes: mem, RequestMilliCPU: reqCPU, RequestMemoryBytes: reqMem, Pids: 10, DiskBytes: 100}
	}
	g := runtime.Spec{
		Container:      runtime.Container{Name: "a", Resources: r(1000, 100, 500, 50)},
		Sidecars:       []runtime.Container{{Name: "b", Resources: r(250, 30, 250, 30)}, {Name: "c", Resources: r(250, 20, 100, 10)}},
		InitContainers: []runtime.Container{{Name: "i", Resources: r(4000, 10, 10, 10)}},
	}
	want := runtime.Resources{MilliCPU: 4000, MemoryBytes: 150, RequestMilliCPU: 850, RequestMemoryBytes: 90, Pids: 30, DiskBytes: 300}
	if got := g.TotalResources(); got != want {
		t.Fatalf("group total %+v, want %+v (sums; an init container counts as the larger of itself and the rest)", got, want)
	}
	g.Sidecars[1].Resources.MemoryBytes = 0 // unlimited
	if got := g.TotalResources(); got.MemoryBytes != 0 || got.MilliCPU != 4000 {
		t.Fatalf("one unlimited container: total %+v, want memory unlimited (0), cpu still 4000", got)
	}
}

func TestValidateGroup(t *testing.T) {
	ok := func() *runtime.Spec {
		return &runtime.Spec{
			ID:        "sb-1",
			Container: runtime.Container{Name: "app", Image: "busybox", DependsOn: []runtime.Dependency{{Container: "db", Condition: runtime.ConditionHealthy}}},
			Sidecars: []runtime.Container{
				{Name: "db", Image: "redis", StartupProbe: &runtime.Probe{Exec: []string{"redis-cli", "ping"}, Period: time.Second}},
				{Name: "migrate", Image: "busybox", DependsOn: []runtime.Dependency{{Container: "db", Condition: runtime.ConditionStarted}}},
			},
			InitContainers: []runtime.Container{{Name: "setup", Image: "busybox"}},
			HostAliases:    []string{"app", "db", "migrate"},
		}
	}
	if err := runtime.ValidateSpec(ok(), 63); err != nil {
		t.Fatalf("valid group refused: %v", err)
	}
	cases := []struct {
		name, want string
		mutate     func(s *runtime.Spec)
	}{
		{"unnamed sidecar", "container name", func(s *runtime.Spec) { s.Sidecars[0].Name = "" }},
		{"unnamed primary of a group", "container name", func(s *runtime.Spec) { s.Name = "" }},
		{"bad name", "container name", func(s *runtime.Spec) { s.Sidecars[1].Name = "Migrate_1" }},
		{"duplicate name", `two containers named "db"`, func(s *runtime.Spec) { s.InitContainers[0].Name = "db" }},
		{"sidecar without image", `container "db": invalid image reference: empty`, func(s *runtime.Spec) { s.Sidecars[0].Image = " " }},
		{"negative sidecar resources", `container "migrate"`, func(s *runtime.Spec) { s.Sidecars[1].Resources.MemoryBytes = -1 }},
		{"unknown dependency", `depends on "cache"`, func(s *runtime.Spec) { s.DependsOn[0].Container = "cache" }},
		{"self dependency", `depends on "app"`, func(s *runtime.Spec) { s.DependsOn[0].Container = "app" }},
		{"dependency on an init container", `depends on "setup"`, func(s *runtime.Spec) { s.DependsOn[0].Container = "setup" }},
		{"unknown condition", `unknown condition "ready"`, func(s *runtime.Spec) { s.DependsOn[0].Condition = "ready" }},
		{"healthy without probe", "has no health check", func(s *runtime.Spec) { s.Sidecars[0].StartupProbe = nil }},
		{"cycle", "cycle: ", func(s *runtime.Spec) {
			s.Sidecars[0].DependsOn = []runtime.Dependency{{Container: "migrate", Condition: runtime.ConditionStarted}}
		}},
		{"init container with deps", "init container takes no depends_on", func(s *runtime.Spec) {
			s.InitContainers[0].DependsOn = []runtime.Dependency{{Container: "db", Condition: runtime.ConditionStarted}}
		}},
		{"probe without command", "startup probe", func(s *runtime.Spec) { s.Sidecars[0].StartupProbe.Exec = nil }},
		{"bad tmpfs", "tmpfs", func(s *runtime.Spec) { s.Sidecars[0].Tmpfs = []string{"/proc/x"} }},
		{"too many tmpfs", "at most 16", func(s *runtime.Spec) {
			for i := range 17 {
				s.Sidecars[0].Tmpfs = append(s.Sidecars[0].Tmpfs, "/t"+string(rune('a'+i)))
			}
		}},
		{"too many host aliases", "at most 64", func(s *runtime.Spec) {
			for i := range 65 {
				s.HostAliases = append(s.HostAliases, "h"+strconv.Itoa(i))
			}
		}},
		{"bad host alias", "host alias", func(s *runtime.Spec) { s.HostAliases = append(s.HostAliases, "Bad Name") }},
		{"too many containers", "at most 16", func(s *runtime.Spec) {
			for i := range 16 {
				s.Sidecars = append(s.Sidecars, runtime.Container{Name: "x" + string(rune('a'+i)), Image: "busybox"})
			}
		}},
	}
	for _, tc := range cases {
		s := ok()
		tc.mutate(s)
		err := runtime.ValidateSpec(s, 63)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one saying %q", tc.name, err, tc.want)
			continue
		}
		if !errors.Is(err, runtime.ErrInvalidSpec) && !errors.Is(err, runtime.ErrInvalidImageRef) {
			t.Errorf("%s: %v wraps neither ErrInvalidSpec nor ErrInvalidImageRef", tc.name, err)
		}
	}
}

// A spec persisted before sandboxes were groups (a flat object) reads as a
// single-container spec, and a single-container spec persists in that same shape.
func TestSpecJSONKeepsTheFlatShape(t *testing.T) {
	old := `{"id":"sb","image":"busybox","command":"/bin/sh","args":["-c","true"],"resources":{"milli_cpu":500},"restart_limit":6}`
	var s runtime.Spec
	if err := json.Unmarshal([]byte(old), &s); err != nil {
		t.Fatal(err)
	}
	if s.Image != "busybox" || s.Command != "/bin/sh" || s.Resources.MilliCPU != 500 || s.RestartLimit != 6 || s.Multi() || s.ContainerName() != runtime.DefaultContainerName {
		t.Fatalf("flat spec read as %+v", s)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	if m["image"] != "busybox" || m["container"] != nil || m["sidecars"] != nil {
		t.Fatalf("single-container spec persists as %s, want the flat shape", b)
	}
}
