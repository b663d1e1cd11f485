package runner

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestValidate(t *testing.T) {
	ok := func() runtime.Spec { return runtime.Spec{Container: runtime.Container{Image: "busybox"}} }
	with := func(f func(*runtime.Spec)) runtime.Spec { s := ok(); f(&s); return s }
	for _, tc := range []struct {
		name     string
		req      CreateRequest
		fields   []string // violated fields, in order; nil = valid
		lifetime time.Duration
	}{
		{"minimal", CreateRequest{Spec: ok()}, nil, DefaultLifetime},
		{"explicit lifetime", CreateRequest{Spec: ok(), Lifetime: time.Hour}, nil, time.Hour},
		{"30 days is allowed", CreateRequest{Spec: ok(), Lifetime: MaxLifetime}, nil, MaxLifetime},
		{"over 30 days", CreateRequest{Spec: ok(), Lifetime: MaxLifetime + time.Second}, []string{"spec.max_lifetime_seconds"}, 0},
		{"negative lifetime", CreateRequest{Spec: ok(), Lifetime: -1}, []string{"spec.max_lifetime_seconds"}, 0},
		{"no image", CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "  "}}}, []string{"spec.containers[0].image"}, 0},
		{"bad id", CreateRequest{Spec: with(func(s *runtime.Spec) { s.ID = "-x" })}, []string{"sandbox_id"}, 0},
		{"id too long", CreateRequest{Spec: with(func(s *runtime.Spec) { s.ID = strings.Repeat("a", 64) })}, []string{"sandbox_id"}, 0},
		{"good id", CreateRequest{Spec: with(func(s *runtime.Spec) { s.ID = "my-sandbox-1" })}, nil, DefaultLifetime},
		{"share token hash", CreateRequest{Spec: with(func(s *runtime.Spec) { s.ShareTokenHash = strings.Repeat("0a", 32) })}, nil, DefaultLifetime},
		{"share token, not its hash", CreateRequest{Spec: with(func(s *runtime.Spec) { s.ShareTokenHash = "secret-token" })}, []string{"share_token_hash"}, 0},
		{"negative resources", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Resources = runtime.Resources{MilliCPU: -1, MemoryBytes: -1, Pids: -1} })},
			[]string{"spec.containers[0].resources.cpu", "spec.containers[0].resources.memory", "spec.containers[0].resources.pids"}, 0},
		{"tiny memory", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Resources.MemoryBytes = 1 << 20 })}, []string{"spec.containers[0].resources.memory"}, 0},
		{"negative restart limit", CreateRequest{Spec: with(func(s *runtime.Spec) { s.RestartLimit = -1 })}, []string{"restart_limit"}, 0},
		{"relative working dir", CreateRequest{Spec: with(func(s *runtime.Spec) { s.WorkingDir = "work" })}, []string{"spec.containers[0].working_dir"}, 0},
		{"NUL in args", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Args = []string{"ok", "a\x00b"} })}, []string{"spec.containers[0].args[1]"}, 0},
		{"bad env name", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Env = map[string]string{"A=B": "x"} })}, []string{"spec.containers[0].environment_variables"}, 0},
		{"file traversal", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Files = []runtime.File{{Path: "/a/../../etc/passwd"}} })}, []string{"spec.containers[0].files[0].path"}, 0},
		{"relative file", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Files = []runtime.File{{Path: "a"}} })}, []string{"spec.containers[0].files[0].path"}, 0},
		{"duplicate file", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Files = []runtime.File{{Path: "/a"}, {Path: "/a/"}} })}, []string{"spec.containers[0].files[1].path"}, 0},
		{"file too big", CreateRequest{Spec: with(func(s *runtime.Spec) {
			s.Files = []runtime.File{{Path: "/a", Content: make([]byte, runtime.MaxFileBytes+1)}}
		})}, []string{"spec.containers[0].files[0].content"}, 0},
		{"file at the agent's socket", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Files = []runtime.File{{Path: "/.sandboxd/run/agent.sock"}} })}, []string{"spec.containers[0].files[0].path"}, 0},
		{"file at the agent's directory", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Files = []runtime.File{{Path: "/ok"}, {Path: "//.sandboxd/"}} })}, []string{"spec.containers[0].files[1].path"}, 0},
		{"too many files", CreateRequest{Spec: with(func(s *runtime.Spec) {
			for i := range runtime.MaxFiles + 1 {
				s.Files = append(s.Files, runtime.File{Path: fmt.Sprintf("/f/%d", i)})
			}
		})}, []string{"spec.containers[0].files"}, 0},
		{"as many files as allowed", CreateRequest{Spec: with(func(s *runtime.Spec) {
			for i := range runtime.MaxFiles {
				s.Files = append(s.Files, runtime.File{Path: fmt.Sprintf("/f/%d", i)})
			}
		})}, nil, DefaultLifetime},
		{"file path too long", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Files = []runtime.File{{Path: strings.Repeat("/abcd", 205)}} })}, []string{"spec.containers[0].files[0].path"}, 0},
		{"too many env vars", CreateRequest{Spec: with(func(s *runtime.Spec) {
			s.Env = map[string]string{}
			for i := range runtime.MaxEnvVars + 1 {
				s.Env[fmt.Sprintf("V%d", i)] = ""
			}
		})}, []string{"spec.containers[0].environment_variables"}, 0},
		{"too many args", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Command = "sh"; s.Args = make([]string, runtime.MaxArgs) })}, []string{"spec.containers[0].args"}, 0},
		{"as many args as allowed", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Command = "sh"; s.Args = make([]string, runtime.MaxArgs-1) })}, nil, DefaultLifetime},
		{"command too long", CreateRequest{Spec: with(func(s *runtime.Spec) { s.Command = strings.Repeat("c", runtime.MaxArgBytes+1) })}, []string{"spec.containers[0].command"}, 0},
		{"every problem at once", CreateRequest{Spec: runtime.Spec{ID: "UPPER", Container: runtime.Container{Resources: runtime.Resources{Pids: -3}}}, Lifetime: -time.Second},
			[]string{"sandbox_id", "spec.containers[0].image", "spec.max_lifetime_seconds", "spec.containers[0].resources.pids"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			err := validate(&req)
			if tc.fields == nil {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				if req.Lifetime != tc.lifetime {
					t.Errorf("lifetime %s, want %s", req.Lifetime, tc.lifetime)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("validate: %v, want *ValidationError", err)
			}
			var got []string
			for _, v := range verr.Violations {
				got = append(got, v.Field)
				if v.Description == "" {
					t.Errorf("violation of %s has no description", v.Field)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.fields, ",") {
				t.Errorf("violated fields %v, want %v", got, tc.fields)
			}
		})
	}
}

func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"/a/b", "/", "", "a", "/a/../b", "/..", "/a\x00", "/a/./b", "//x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if checkPath(p) != nil {
			return
		}
		// Whatever passes is absolute, NUL-free and cannot climb out of the root.
		if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
			t.Fatalf("accepted %q", p)
		}
		for _, el := range strings.Split(p, "/") {
			if el == ".." {
				t.Fatalf("accepted %q with '..'", p)
			}
		}
	})
}

func TestNewIDIsALabel(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := NewID()
		if !idPattern.MatchString(id) || seen[id] {
			t.Fatalf("NewID() = %q (seen before: %v)", id, seen[id])
		}
		seen[id] = true
	}
}
