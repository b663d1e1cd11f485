package k8s

import (
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// chartHelm is helm for the tests that render the chart without a cluster: $HELM or
// scripts/build-helm.sh's cached binary, else (building helm takes minutes) a skip —
// unless SANDBOXD_K8S_REQUIRED is set (make k8s-test builds it first).
func chartHelm(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: renders the chart with helm")
	}
	if os.Getenv("SANDBOXD_K8S_REQUIRED") != "" || os.Getenv("HELM") != "" {
		return needHelm(t)
	}
	h := filepath.Join(env("SANDBOXD_CACHE", "/var/cache/sandboxd"), "helm", env("SANDBOXD_HELM_VERSION", "v3.16.4"), "helm")
	if _, err := os.Stat(h); err != nil {
		t.Skipf("no helm (%v): run scripts/build-helm.sh or set HELM", err)
	}
	return h
}

// runnerArgs renders the chart's Deployment with args and returns the runner's args.
func runnerArgs(t *testing.T, helm string, args ...string) ([]string, error) {
	t.Helper()
	cmd := osexec.Command(helm, append([]string{"template", "sandboxd-runner", chartDir, "--namespace", "sandboxd",
		"--show-only", "templates/deployment.yaml"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *osexec.ExitError
		if errors.As(err, &ee) {
			return nil, &chartError{string(ee.Stderr)}
		}
		t.Fatalf("helm template: %v", err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(out, &d); err != nil {
		t.Fatalf("rendered Deployment: %v\n%s", err, out)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "runner" {
			return c.Args, nil
		}
	}
	t.Fatalf("no runner container in\n%s", out)
	return nil, nil
}

type chartError struct{ stderr string }

func (e *chartError) Error() string { return e.stderr }

// withPrefix is the args of args that start with prefix.
func withPrefix(args []string, prefix string) []string {
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, prefix) {
			out = append(out, a)
		}
	}
	return out
}

// TestChartPlatformRegistry: the chart's platformRegistry values become the runner's
// --platform-registry (and --insecure-registry for plain HTTP); unset, neither flag is
// passed; a host that is not host[:port] fails the render with the value named. The chart
// passes `helm lint` with and without them.
func TestChartPlatformRegistry(t *testing.T) {
	helm := chartHelm(t)
	for _, set := range [][]string{nil, {"--set", "platformRegistry.host=gw.example.com:8080", "--set", "platformRegistry.plainHTTP=true"}} {
		if out, err := osexec.Command(helm, append([]string{"lint", "--strict", chartDir}, set...)...).CombinedOutput(); err != nil {
			t.Errorf("helm lint %v: %v\n%s", set, err, out)
		}
	}

	for _, c := range []struct {
		set            []string
		platform, http []string
	}{
		{nil, nil, nil},
		{[]string{"--set", "platformRegistry.host=gw.example.com:8080"}, []string{"--platform-registry=gw.example.com:8080"}, nil},
		{[]string{"--set", "platformRegistry.host=10.0.0.7:5000", "--set", "platformRegistry.plainHTTP=true"},
			[]string{"--platform-registry=10.0.0.7:5000"}, []string{"--insecure-registry=10.0.0.7:5000"}},
		{[]string{"--set-string", "platformRegistry.host=[fd00::1]:5000"}, []string{"--platform-registry=[fd00::1]:5000"}, nil},
		// plainHTTP without a host: nothing (there is no registry to reach over HTTP).
		{[]string{"--set", "platformRegistry.plainHTTP=true"}, nil, nil},
	} {
		args, err := runnerArgs(t, helm, c.set...)
		if err != nil {
			t.Errorf("%v: %v", c.set, err)
			continue
		}
		if got := withPrefix(args, "--platform-registry"); !slices.Equal(got, c.platform) {
			t.Errorf("%v: %q, want %q", c.set, got, c.platform)
		}
		if got := withPrefix(args, "--insecure-registry"); !slices.Equal(got, c.http) {
			t.Errorf("%v: %q, want %q", c.set, got, c.http)
		}
		if !slices.Contains(args, "--backend=kubernetes") {
			t.Errorf("%v: args %q lost the backend", c.set, args)
		}
	}

	for _, bad := range []string{"http://gw.example.com", "gw.example.com/org-a", "gw example.com", "gw.example.com:80\n- --privileged"} {
		_, err := runnerArgs(t, helm, "--set-string", "platformRegistry.host="+bad)
		if err == nil || !strings.Contains(err.Error(), "platformRegistry.host") || !strings.Contains(err.Error(), "want host[:port]") {
			t.Errorf("host %q: %v, want the render refused naming platformRegistry.host", bad, err)
		}
	}
}
