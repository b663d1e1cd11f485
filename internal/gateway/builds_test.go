package gateway

import (
	"strings"
	"testing"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

func TestCheckStartBuild(t *testing.T) {
	ok := func() *buildv1.StartBuildRequest {
		return &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Template{Template: "My App (py3.11)"}, Context: []byte("x")}
	}
	tg, err := checkStartBuild("org-1", ok(), 10)
	if err != nil || tg != (buildTarget{Repository: "org-1/my-app-py3-11", Tag: "latest", Template: "My App (py3.11)"}) {
		t.Errorf("template target: %+v %v", tg, err)
	}
	r := ok()
	r.Target = &buildv1.StartBuildRequest_Repository{Repository: "tools/app:v1.2"}
	if tg, err := checkStartBuild("org-1", r, 10); err != nil || tg != (buildTarget{Repository: "org-1/tools/app", Tag: "v1.2"}) {
		t.Errorf("repository target: %+v %v", tg, err)
	}
	for _, c := range []struct {
		field string
		edit  func(*buildv1.StartBuildRequest)
	}{
		{"target", func(r *buildv1.StartBuildRequest) { r.Target = nil }},
		{"template", func(r *buildv1.StartBuildRequest) { r.Target = &buildv1.StartBuildRequest_Template{Template: " "} }},
		{"repository", func(r *buildv1.StartBuildRequest) {
			r.Target = &buildv1.StartBuildRequest_Repository{Repository: "Bad Name"}
		}},
		{"repository", func(r *buildv1.StartBuildRequest) {
			r.Target = &buildv1.StartBuildRequest_Repository{Repository: "app:-x"}
		}},
		{"repository", func(r *buildv1.StartBuildRequest) {
			r.Target = &buildv1.StartBuildRequest_Repository{Repository: "../etc"}
		}},
		{"dockerfile", func(r *buildv1.StartBuildRequest) { r.Dockerfile = "../Dockerfile" }},
		{"build_args", func(r *buildv1.StartBuildRequest) { r.BuildArgs = map[string]string{"1x": ""} }},
		{"target_stage", func(r *buildv1.StartBuildRequest) { r.TargetStage = "a b" }},
		{"context", func(r *buildv1.StartBuildRequest) { r.Context = nil }},
		{"context", func(r *buildv1.StartBuildRequest) { r.Context = make([]byte, 11) }},
		{"timeout_seconds", func(r *buildv1.StartBuildRequest) { r.TimeoutSeconds = -1 }},
		{"timeout_seconds", func(r *buildv1.StartBuildRequest) { r.TimeoutSeconds = 7201 }},
		{"request_id", func(r *buildv1.StartBuildRequest) { r.RequestId = strings.Repeat("x", 129) }},
	} {
		r := ok()
		c.edit(r)
		_, err := checkStartBuild("org-1", r, 10)
		vs := apierr.Violations(err)
		if apierr.Reason(err) != apierr.InvalidRequest || len(vs) != 1 || vs[0].Field != c.field {
			t.Errorf("%s: %v %v, want one violation of %s", c.field, err, vs, c.field)
		}
	}
	// An organization that cannot own repositories names the target.
	if _, err := checkStartBuild("Bad Org", ok(), 10); apierr.Reason(err) != apierr.InvalidRequest {
		t.Errorf("bad org: %v", err)
	}
}

func TestTemplateRepository(t *testing.T) {
	for in, want := range map[string]string{
		"python":                  "python",
		"My App (py3.11)":         "my-app-py3-11",
		"--x--":                   "x",
		"日本":                      "template",
		"":                        "template",
		strings.Repeat("a-", 100): strings.TrimRight(strings.Repeat("a-", 64), "-"),
	} {
		if got := templateRepository(in); got != want {
			t.Errorf("templateRepository(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzTemplateRepository(f *testing.F) {
	for _, s := range []string{"python", "My App", "日本", "a--b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := templateRepository(s)
		if got == "" || len(got) > 128 || strings.HasPrefix(got, "-") || strings.HasSuffix(got, "-") || strings.Contains(got, "--") {
			t.Fatalf("templateRepository(%q) = %q", s, got)
		}
		// Every display name makes a valid repository of a valid organization.
		if _, err := checkStartBuildRepo(s); strings.TrimSpace(s) != "" && len(strings.TrimSpace(s)) <= 255 && err != nil {
			t.Fatalf("templateRepository(%q) = %q, not a repository name: %v", s, got, err)
		}
	})
}

func checkStartBuildRepo(name string) (buildTarget, error) {
	return checkStartBuild("org-1", &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Template{Template: name}, Context: []byte("x")}, 1)
}
