package k8s

import (
	"errors"
	"fmt"
	"maps"
	"os"
	osexec "os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sandboxd/sandboxd/internal/install"
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
	c, err := runnerContainer(t, helm, args...)
	return c.Args, err
}

// runnerContainer renders the chart's Deployment with args and returns its runner container.
func runnerContainer(t *testing.T, helm string, args ...string) (corev1.Container, error) {
	t.Helper()
	cmd := osexec.Command(helm, append([]string{"template", "sandboxd-runner", chartDir, "--namespace", "sandboxd",
		"--show-only", "templates/deployment.yaml"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *osexec.ExitError
		if errors.As(err, &ee) {
			return corev1.Container{}, &chartError{string(ee.Stderr)}
		}
		t.Fatalf("helm template: %v", err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(out, &d); err != nil {
		t.Fatalf("rendered Deployment: %v\n%s", err, out)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "runner" {
			return c, nil
		}
	}
	t.Fatalf("no runner container in\n%s", out)
	return corev1.Container{}, nil
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

// helloShape is a runner container's gate-hello settings: its --hello-* args, its POD_IP
// variable's source and its ports named hello.
func helloShape(c corev1.Container) []any {
	var env []string
	for _, e := range c.Env {
		if e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env = append(env, e.ValueFrom.FieldRef.FieldPath)
		}
	}
	var ports []corev1.ContainerPort
	for _, p := range c.Ports {
		if p.Name == "hello" {
			ports = append(ports, p)
		}
	}
	return []any{withPrefix(c.Args, "--hello-"), env, ports}
}

// TestChartHello: the chart turns the gate's hello on by default exactly as the installer
// does (args to the Pod's IP, POD_IP from the downward API, the UDP port; the manifest is
// the chart's default rendering, and internal/install TestHelloCopiesAgree checks it
// against the installer without helm); hello.enabled=false drops all of it (the runner
// then waits for the kubelet); hello.port moves it. The chart passes helm lint either way.
func TestChartHello(t *testing.T) {
	helm := chartHelm(t)
	for _, set := range [][]string{nil, {"--set", "hello.enabled=false"}} {
		if out, err := osexec.Command(helm, append([]string{"lint", "--strict", chartDir}, set...)...).CombinedOutput(); err != nil {
			t.Errorf("helm lint %v: %v\n%s", set, err, out)
		}
	}
	var installer corev1.Container
	for _, o := range install.Objects(install.Values{Namespace: "sandboxd", Image: "i", AgentImage: "a"}) {
		if d, ok := o.(*appsv1.Deployment); ok {
			installer = d.Spec.Template.Spec.Containers[0]
		}
	}
	want := []any{
		[]string{fmt.Sprintf("--hello-listen=:%d", install.HelloPort), fmt.Sprintf("--hello-addr=[$(POD_IP)]:%d", install.HelloPort)},
		[]string{"status.podIP"},
		[]corev1.ContainerPort{{Name: "hello", ContainerPort: install.HelloPort, Protocol: corev1.ProtocolUDP}},
	}
	if got := helloShape(installer); !reflect.DeepEqual(got, want) {
		t.Errorf("installer: hello %v, want %v", got, want)
	}
	for _, c := range []struct {
		set  []string
		want []any
	}{
		{nil, want},
		{[]string{"--set", "hello.enabled=false"}, []any{[]string(nil), []string(nil), []corev1.ContainerPort(nil)}},
		{[]string{"--set", "hello.port=7500"}, []any{[]string{"--hello-listen=:7500", "--hello-addr=[$(POD_IP)]:7500"},
			[]string{"status.podIP"}, []corev1.ContainerPort{{Name: "hello", ContainerPort: 7500, Protocol: corev1.ProtocolUDP}}}},
	} {
		ctr, err := runnerContainer(t, helm, c.set...)
		if err != nil {
			t.Fatalf("%v: %v", c.set, err)
		}
		if got := helloShape(ctr); !reflect.DeepEqual(got, c.want) {
			t.Errorf("chart %v: hello %v, want %v", c.set, got, c.want)
		}
	}
}

// TestChartRuntimeClasses: the chart's runtimeClasses renders the same --runtime-classes
// as the installer for the same map (runc first, the rest in name order); empty (the
// default), no flag but the commented example the plain manifest carries (internal/install
// TestRuntimeClassesCopiesAgree); a value the runner would refuse fails the render naming
// runtimeClasses. The chart passes helm lint with and without it.
func TestChartRuntimeClasses(t *testing.T) {
	helm := chartHelm(t)
	gvisor := []string{"--set", "runtimeClasses.runc=,runtimeClasses.gvisor=gvisor"}
	for _, set := range [][]string{nil, gvisor} {
		if out, err := osexec.Command(helm, append([]string{"lint", "--strict", chartDir}, set...)...).CombinedOutput(); err != nil {
			t.Errorf("helm lint %v: %v\n%s", set, err, out)
		}
	}
	for _, c := range []struct {
		set []string
		m   map[string]string
	}{
		{nil, nil},
		{[]string{"--set", "runtimeClasses.runc="}, map[string]string{"runc": ""}},
		{gvisor, map[string]string{"runc": "", "gvisor": "gvisor"}},
		{[]string{"--set", "runtimeClasses.kata=kata-qemu,runtimeClasses.gvisor=gvisor.example.com,runtimeClasses.runc=runc-rc,runtimeClasses.a=a"},
			map[string]string{"runc": "runc-rc", "gvisor": "gvisor.example.com", "kata": "kata-qemu", "a": "a"}},
		// runc: ~ (YAML null) is the cluster's default runtime, as "" is.
		{[]string{"--set", "runtimeClasses.runc=null,runtimeClasses.gvisor=gvisor"}, map[string]string{"runc": "", "gvisor": "gvisor"}},
	} {
		args, err := runnerArgs(t, helm, c.set...)
		if err != nil {
			t.Errorf("%v: %v", c.set, err)
			continue
		}
		want := withPrefix(install.Args(install.Values{Namespace: "sandboxd", Image: "i", AgentImage: "a", RuntimeClasses: c.m}), "--runtime-classes")
		if got := withPrefix(args, "--runtime-classes"); !slices.Equal(got, want) || (c.m != nil) != (len(got) == 1) {
			t.Errorf("chart %v: %q, installer %q", c.set, got, want)
		}
	}
	// Each refusal with a map of strings (m) is the installer's too (install.CheckRuntimeClasses).
	long := strings.Repeat("g", 64)
	// install.MaxRuntimeClasses classes render; one more does not.
	most, mostSet := map[string]string{"runc": ""}, []string{"runtimeClasses.runc="}
	for i := 1; len(most) < install.MaxRuntimeClasses; i++ {
		most[fmt.Sprintf("c%d", i)] = fmt.Sprintf("rc%d", i)
		mostSet = append(mostSet, fmt.Sprintf("runtimeClasses.c%d=rc%d", i, i))
	}
	if args, err := runnerArgs(t, helm, "--set", strings.Join(mostSet, ",")); err != nil {
		t.Errorf("%d classes: %v", len(most), err)
	} else if got, want := withPrefix(args, "--runtime-classes"), []string{install.RuntimeClassesArg(most)}; !slices.Equal(got, want) {
		t.Errorf("%d classes: chart %q, installer %q", len(most), got, want)
	}
	tooMany := maps.Clone(most)
	tooMany["one-more"] = "x"
	for _, c := range []struct {
		set []string
		m   map[string]string
		err string
	}{
		{[]string{"--set", "runtimeClasses.gvisor=gvisor"}, map[string]string{"gvisor": "gvisor"}, "runtimeClasses: no entry for runc"},
		{[]string{"--set", "runtimeClasses.runc=,runtimeClasses.gVisor=gvisor"}, map[string]string{"runc": "", "gVisor": "gvisor"}, `runtimeClasses: class "gVisor": want a DNS label`},
		{[]string{"--set", "runtimeClasses.runc=,runtimeClasses." + long + "=gvisor"}, map[string]string{"runc": "", long: "gvisor"}, "want a DNS label"},
		{[]string{"--set", "runtimeClasses.runc=,runtimeClasses.gvisor=run_sc"}, map[string]string{"runc": "", "gvisor": "run_sc"}, `runtimeClasses.gvisor: RuntimeClass name "run_sc": want a DNS subdomain`},
		{[]string{"--set-string", "runtimeClasses.runc=,runtimeClasses.gvisor=a..b"}, map[string]string{"runc": "", "gvisor": "a..b"}, `RuntimeClass name "a..b"`},
		{[]string{"--set-string", "runtimeClasses.runc=x\n- --privileged"}, map[string]string{"runc": "x\n- --privileged"}, `runtimeClasses.runc: RuntimeClass name`},
		{[]string{"--set", "runtimeClasses.runc=,runtimeClasses.gvisor=1"}, nil, "runtimeClasses.gvisor: want a RuntimeClass name (a string"},
		{[]string{"--set", "runtimeClasses=gvisor"}, nil, "runtimeClasses: want a map"},
		{[]string{"--set", strings.Join(mostSet, ",") + ",runtimeClasses.one-more=x"}, tooMany, "runtimeClasses: 17 classes, want at most 16"},
	} {
		_, err := runnerArgs(t, helm, c.set...)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%v: %v, want the render refused with %q", c.set, err, c.err)
		}
		if c.m != nil && install.CheckRuntimeClasses(c.m) == nil {
			t.Errorf("%v: the chart refuses it, the installer takes %v", c.set, c.m)
		}
	}
}
