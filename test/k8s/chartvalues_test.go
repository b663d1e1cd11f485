package k8s

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	osexec "os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
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

// renderedChart is every object `helm template` renders, by "Kind/name".
type renderedChart map[string][]byte

// renderChart renders the whole chart as release (namespace sandboxd) with args.
func renderChart(t *testing.T, helm, release string, args ...string) (renderedChart, error) {
	t.Helper()
	cmd := osexec.Command(helm, append([]string{"template", release, chartDir, "--namespace", "sandboxd"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *osexec.ExitError
		if errors.As(err, &ee) {
			return nil, &chartError{string(ee.Stderr)}
		}
		t.Fatalf("helm template: %v", err)
	}
	objs := renderedChart{}
	for doc := range bytes.SplitSeq(out, []byte("\n---\n")) {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("rendered object: %v\n%s", err, doc)
		}
		if m.Kind == "" {
			continue
		}
		key := m.Kind + "/" + m.Metadata.Name
		if _, dup := objs[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		objs[key] = doc
	}
	return objs, nil
}

// get decodes the object key into obj (strictly: a field the API does not know fails).
func (r renderedChart) get(t *testing.T, key string, obj any) bool {
	t.Helper()
	doc, ok := r[key]
	if !ok {
		return false
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("%s: %v\n%s", key, err, doc)
	}
	return true
}

// named is the names of the objects of kind, sorted.
func (r renderedChart) named(kind string) []string {
	var out []string
	for _, k := range r.keys() {
		if name, ok := strings.CutPrefix(k, kind+"/"); ok {
			out = append(out, name)
		}
	}
	return out
}

func (r renderedChart) keys() []string {
	var out []string
	for k := range r {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// roleGrants: the Role's rules on resource (verbs, sorted, per rule).
func roleGrants(role rbacv1.Role, resource string) []string {
	var out []string
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, resource) {
			out = append(out, strings.Join(r.Verbs, ","))
		}
	}
	return out
}

// TestChartEgress (issue 23): the chart's egress values. Off (the default): no egress
// Service, no NetworkPolicy, no --egress-* args or ports, no enableServiceLinks, and the other
// egress values change nothing (that render equals the default one; the default render is
// not compared with the chart before egress existed). On: a ClusterIP Service `<fullname>-egress` selecting the
// runner's Pods (443/TCP → the proxy's port, 53/UDP and 53/TCP → the DNS's), the four
// --egress-* args naming that Service's ClusterIP through the variable the kubelet gives
// the container for it (or the pinned egress.clusterIP), the container ports, and a
// NetworkPolicy on the runner's Pods that admits the proxy and DNS ports from the sandbox
// namespace's sandbox Pods only (the labels the backend puts on them) and the runner's
// other ports from anywhere. The Role grants the egress roots ConfigMap either way.
// dnsPolicy/dnsConfig (the runner Pod's resolvers, where the proxy resolves) render as
// given, and nothing by default. Bad values fail the render naming the value. helm lint
// passes with egress on.
func TestChartEgress(t *testing.T) {
	helm := chartHelm(t)
	on := []string{"--set", "egress.enabled=true"}
	if out, err := osexec.Command(helm, append([]string{"lint", "--strict", chartDir}, on...)...).CombinedOutput(); err != nil {
		t.Errorf("helm lint %v: %v\n%s", on, err, out)
	}

	// The variable the kubelet gives a container for a Service of its namespace: the
	// Service's name upper-cased, '-' as '_'.
	serviceVar := func(svc string) string {
		return "$(" + strings.ToUpper(strings.ReplaceAll(svc, "-", "_")) + "_SERVICE_HOST)"
	}
	// The args the runner gets with the proxy and DNS on their default ports, reached at addr.
	onArgs := func(addr string) []string {
		return []string{"--egress-proxy-listen=:15443", "--egress-dns-listen=:5353", "--egress-proxy-addr=" + addr, "--egress-dns-addr=" + addr}
	}
	// A release name of helm's maximum length (53): the chart truncates its names to 63.
	long := "r" + strings.Repeat("x", 51) + "9"
	egressPorts := func(c corev1.Container) []corev1.ContainerPort {
		var out []corev1.ContainerPort
		for _, p := range c.Ports {
			if strings.HasPrefix(p.Name, "egress") {
				out = append(out, p)
			}
		}
		return out
	}
	runner := func(r renderedChart) (appsv1.Deployment, corev1.Container) {
		t.Helper()
		var d appsv1.Deployment
		if names := r.named("Deployment"); len(names) != 1 || !r.get(t, "Deployment/"+names[0], &d) {
			t.Fatalf("want one Deployment in %v", r.keys())
		}
		return d, d.Spec.Template.Spec.Containers[0]
	}
	checkRole := func(name string, r renderedChart) {
		t.Helper()
		var role rbacv1.Role
		d, _ := runner(r)
		if !r.get(t, "Role/"+d.Name+"-sandboxes", &role) {
			t.Fatalf("%s: no Role %s-sandboxes in %v", name, d.Name, r.keys())
		}
		if got, want := roleGrants(role, "configmaps"), []string{"create", "get,update"}; !slices.Equal(got, want) {
			t.Errorf("%s: the Role's configmaps grants %q, want %q (the egress roots ConfigMap)", name, got, want)
		}
	}

	// Off: none of the egress objects, args or ports (checked one by one, not against a
	// golden render).
	off, err := renderChart(t, helm, "sandboxd-runner")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range off.keys() {
		if strings.HasSuffix(k, "-egress") || strings.HasPrefix(k, "NetworkPolicy/") {
			t.Errorf("off: %s rendered", k)
		}
	}
	d, c := runner(off)
	if got := withPrefix(c.Args, "--egress"); got != nil {
		t.Errorf("off: args %q", got)
	}
	if got := egressPorts(c); got != nil {
		t.Errorf("off: ports %v", got)
	}
	if d.Spec.Template.Spec.EnableServiceLinks != nil {
		t.Errorf("off: enableServiceLinks set")
	}
	checkRole("off", off)
	// Off, the other egress values change nothing.
	offSet, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.proxyPort=1,egress.clusterIP=10.96.0.53,egress.forbid={10.0.0.0/8}")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(offSet, off) {
		t.Errorf("off with other egress values: %v, want %v", offSet.keys(), off.keys())
	}

	wantPorts := func(proxy, dns int32) []corev1.ContainerPort {
		return []corev1.ContainerPort{{Name: "egress-proxy", ContainerPort: proxy},
			{Name: "egress-dns", ContainerPort: dns, Protocol: corev1.ProtocolUDP}, {Name: "egress-dns-tcp", ContainerPort: dns}}
	}
	for _, tc := range []struct {
		name       string
		release    string // default sandboxd-runner
		set        []string
		args       []string // "$(SERVICE)": the variable of the rendered egress Service
		proxy, dns int32
		clusterIP  string
		sandboxNS  string
		policy     bool
		otherPorts []networkingv1.NetworkPolicyPort
	}{
		{name: "on", set: on, policy: true, proxy: 15443, dns: 5353, sandboxNS: "sandboxd", args: onArgs("$(SERVICE)")},
		// Release names the chart's name is not part of (fullname <release>-sandboxd-runner),
		// and one of 53 characters (fullname and Service name truncated): the args name the
		// variable of the Service the chart renders, whatever its name.
		{name: "release foo", release: "foo", set: on, policy: true, proxy: 15443, dns: 5353, sandboxNS: "sandboxd", args: onArgs("$(SERVICE)")},
		{name: "release my-runner", release: "my-runner", set: on, policy: true, proxy: 15443, dns: 5353, sandboxNS: "sandboxd", args: onArgs("$(SERVICE)")},
		{name: "release of 53 characters", release: long, set: on, policy: true, proxy: 15443, dns: 5353, sandboxNS: "sandboxd", args: onArgs("$(SERVICE)")},
		{name: "pinned, forbid, moved ports, no edge or hello, other sandbox namespace",
			set: []string{"--set", "egress.enabled=true,egress.clusterIP=10.96.0.53,egress.proxyPort=8443,egress.dnsPort=7444,egress.forbid={100.64.0.0/10,fd00::/108}",
				"--set", "edge.enabled=false,hello.enabled=false,sandboxNamespace=sbx"},
			policy: true, proxy: 8443, dns: 7444, clusterIP: "10.96.0.53", sandboxNS: "sbx",
			args: []string{"--egress-proxy-listen=:8443", "--egress-dns-listen=:7444", "--egress-proxy-addr=10.96.0.53", "--egress-dns-addr=10.96.0.53",
				"--egress-forbid=100.64.0.0/10,fd00::/108"},
			otherPorts: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, 7443), npPort(corev1.ProtocolTCP, 9467)}},
		{name: "no NetworkPolicy", set: []string{"--set", "egress.enabled=true,egress.networkPolicy.enabled=false"}, proxy: 15443, dns: 5353,
			args: onArgs("$(SERVICE)")},
	} {
		release := tc.release
		if release == "" {
			release = "sandboxd-runner"
		}
		r, err := renderChart(t, helm, release, tc.set...)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		checkRole(tc.name, r)
		d, c := runner(r)
		// The egress Service: the Service that is not the runner's own (named as its Deployment).
		var svcName string
		for _, n := range r.named("Service") {
			if n != d.Name {
				if svcName != "" {
					t.Fatalf("%s: Services %v", tc.name, r.named("Service"))
				}
				svcName = n
			}
		}
		if svcName == "" {
			t.Errorf("%s: no egress Service in %v", tc.name, r.keys())
			continue
		}
		if len(svcName) > 63 || !regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?-egress$`).MatchString(svcName) {
			t.Errorf("%s: Service name %q: want a DNS-1035 label of at most 63 ending in -egress", tc.name, svcName)
		}
		wantArgs := slices.Clone(tc.args)
		for i, a := range wantArgs {
			wantArgs[i] = strings.ReplaceAll(a, "$(SERVICE)", serviceVar(svcName))
		}
		if got := withPrefix(c.Args, "--egress"); !slices.Equal(got, wantArgs) {
			t.Errorf("%s: args %q, want %q (Service %s)", tc.name, got, wantArgs, svcName)
		}
		if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--runner-peer-pods=") }) {
			t.Errorf("%s: no --runner-peer-pods (the runner refuses --egress-* without it)", tc.name)
		}
		if got, want := egressPorts(c), wantPorts(tc.proxy, tc.dns); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: ports %v, want %v", tc.name, got, want)
		}
		if links := d.Spec.Template.Spec.EnableServiceLinks; (tc.clusterIP == "") != (links != nil && *links) {
			t.Errorf("%s: enableServiceLinks %v (the variable is needed without a pinned clusterIP)", tc.name, links)
		}

		var svc corev1.Service
		if !r.get(t, "Service/"+svcName, &svc) {
			t.Errorf("%s: no Service %s in %v", tc.name, svcName, r.keys())
			continue
		}
		podLabels := d.Spec.Template.Labels
		if svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.ClusterIP != tc.clusterIP || svc.Namespace != "sandboxd" {
			t.Errorf("%s: Service %s type %q clusterIP %q namespace %q", tc.name, svc.Name, svc.Spec.Type, svc.Spec.ClusterIP, svc.Namespace)
		}
		if len(svc.Spec.Selector) == 0 || !reflect.DeepEqual(svc.Spec.Selector, d.Spec.Selector.MatchLabels) {
			t.Errorf("%s: Service selector %v, the runner's Pods %v", tc.name, svc.Spec.Selector, podLabels)
		}
		wantSvc := []corev1.ServicePort{
			{Name: "proxy", Port: 443, TargetPort: intstr.FromString("egress-proxy"), Protocol: corev1.ProtocolTCP},
			{Name: "dns", Port: 53, TargetPort: intstr.FromString("egress-dns"), Protocol: corev1.ProtocolUDP},
			{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromString("egress-dns-tcp"), Protocol: corev1.ProtocolTCP},
		}
		if !reflect.DeepEqual(svc.Spec.Ports, wantSvc) {
			t.Errorf("%s: Service ports %+v, want %+v", tc.name, svc.Spec.Ports, wantSvc)
		}

		var np networkingv1.NetworkPolicy
		if has := r.get(t, "NetworkPolicy/"+svcName, &np); has != tc.policy {
			t.Errorf("%s: NetworkPolicy rendered %v, want %v", tc.name, has, tc.policy)
		}
		if !tc.policy {
			continue
		}
		if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("%s: NetworkPolicy selects %v types %v", tc.name, np.Spec.PodSelector, np.Spec.PolicyTypes)
		}
		if len(np.Spec.Ingress) != 2 {
			t.Fatalf("%s: NetworkPolicy ingress %+v", tc.name, np.Spec.Ingress)
		}
		sandboxes := np.Spec.Ingress[0]
		wantFrom := []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": tc.sandboxNS}},
			// Sandbox Pods only: the backend's managed-by label and a sandbox ID (its pre-pull
			// Pods carry managed-by but no sandbox ID).
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{kubernetes.LabelManagedBy: kubernetes.ManagedBy},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: kubernetes.LabelSandbox, Operator: metav1.LabelSelectorOpExists}}},
		}}
		wantEgressPorts := []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, tc.proxy), npPort(corev1.ProtocolUDP, tc.dns), npPort(corev1.ProtocolTCP, tc.dns)}
		if !reflect.DeepEqual(sandboxes.From, wantFrom) || !reflect.DeepEqual(sandboxes.Ports, wantEgressPorts) {
			t.Errorf("%s: sandbox rule %+v, want from %+v ports %+v", tc.name, sandboxes, wantFrom, wantEgressPorts)
		}
		others := np.Spec.Ingress[1]
		wantOthers := tc.otherPorts
		if wantOthers == nil {
			wantOthers = []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, 7443), npPort(corev1.ProtocolTCP, 8443),
				npPort(corev1.ProtocolTCP, 9467), npPort(corev1.ProtocolUDP, 7444)}
		}
		if others.From != nil || !reflect.DeepEqual(others.Ports, wantOthers) {
			t.Errorf("%s: other rule %+v, want from anywhere to %+v", tc.name, others, wantOthers)
		}
		// Every port the runner's container declares is admitted by one of the rules.
		for _, p := range c.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			want := npPort(proto, p.ContainerPort)
			if !slices.ContainsFunc(append(slices.Clone(others.Ports), sandboxes.Ports...), func(q networkingv1.NetworkPolicyPort) bool { return reflect.DeepEqual(q, want) }) {
				t.Errorf("%s: the runner's port %s %d/%s is not admitted", tc.name, p.Name, p.ContainerPort, proto)
			}
		}
	}

	for _, bad := range []struct {
		set, err string
	}{
		{"egress.enabled=yes", "egress.enabled: want true or false"},
		{"egress.enabled=true,egress.proxyPort=0", "egress.proxyPort: want a port 1-65535"},
		{"egress.enabled=true,egress.dnsPort=65536", "egress.dnsPort: want a port 1-65535"},
		{"egress.enabled=true,egress.proxyPort=abc", "egress.proxyPort: want a port"},
		{"egress.enabled=true,egress.proxyPort=443", "egress.proxyPort: port 443 is below 1024: the runner (a non-root user, no capabilities) cannot bind it"},
		{"egress.enabled=true,egress.dnsPort=53", "egress.dnsPort: port 53 is below 1024"},
		{"egress.enabled=true,egress.dnsPort=1023", "egress.dnsPort: port 1023 is below 1024"},
		{"egress.enabled=true,egress.dnsPort=15443", "egress.proxyPort and egress.dnsPort: both 15443"},
		{"egress.enabled=true,egress.proxyPort=7443", "egress.proxyPort: port 7443 is already the runner API's"},
		{"egress.enabled=true,egress.dnsPort=9467", "egress.dnsPort: port 9467 is already metrics.port's"},
		{"egress.enabled=true,egress.proxyPort=8443", "egress.proxyPort: port 8443 is already the edge's"},
		{"egress.enabled=true,egress.dnsPort=7444", "egress.dnsPort: UDP port 7444 is already the gate hello's"},
		{"egress.enabled=true,egress.clusterIP=None", `egress.clusterIP "None": want an IP address`},
		{"egress.enabled=true,egress.clusterIP=10.96.0.300", `egress.clusterIP "10.96.0.300": want an IP address`},
		{"egress.enabled=true,egress.clusterIP=127.0.0.1", `egress.clusterIP "127.0.0.1": not an address`},
		{"egress.enabled=true,egress.forbid={10.0.0.0/8,bad}", `egress.forbid: "bad": want a CIDR`},
		{"egress.enabled=true,egress.forbid=10.0.0.0/8", "egress.forbid: want a list of CIDRs"},
		{"egress.enabled=true,egress.networkPolicy.enabled=no", "egress.networkPolicy.enabled: want true or false"},
		{"egress=1", "egress: want a map"},
		{"egress=null", "egress: want a map"},
		{"egress.enabled=true,egress.networkPolicy=false", "egress.networkPolicy: want a map"},
		{"dnsPolicy=Bogus", `dnsPolicy "Bogus": want ClusterFirst`},
		{"dnsPolicy=None", "dnsPolicy None: dnsConfig.nameservers must name"},
		{"dnsConfig=1.2.3.4", "dnsConfig: want a Pod dnsConfig"},
	} {
		_, err := renderChart(t, helm, "sandboxd-runner", "--set", bad.set)
		if err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("%s: %v, want the render refused with %q", bad.set, err, bad.err)
		}
	}
	// egress.forbid: the chart takes a CIDR exactly when the runner does (--egress-forbid:
	// netip.ParsePrefix, an IPv4-mapped prefix not shorter than /96), refusing the rest
	// naming it.
	runnerTakesForbid := func(c string) bool {
		p, err := netip.ParsePrefix(c)
		return err == nil && (!p.Addr().Is4In6() || p.Bits() >= 96)
	}
	for _, c := range []string{"10.0.0.0/8", "0.0.0.0/0", "10.1.2.3/32", "fd00::/108", "::/0", "FD00::/8", "1:2:3:4:5:6:7:8/128",
		"1:2:3:4:5:6:7::/112", "::1.2.3.4/128", "1:2:3:4:5:6:1.2.3.4/128", "::ffff:10.0.0.0/104", "::ffff:a00:0/104", "0:0:0:0:0:ffff:a00:0/96",
		"999.0.0.0/99", "10.0.0.0/33", "10.0.0.0/08", "010.0.0.0/8", "10.0.0/8", "10.0.0.0", "fd00::/129", "fd00::/999", "fd00::/0128",
		":::/8", "1::2::3/64", "1.2.3.4::/8", "1:2:3:4:5:6:7:8:9/128", "1:2:3:4:5:6:7/128", "12345::/8", "fe80::1%eth0/64", "fd00::/-1",
		"::ffff:10.0.0.0/8", "::ffff:a00:0/95", "0:0:0:0:0:ffff:a00:0/0"} {
		_, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true", "--set-string", "egress.forbid[0]="+c)
		switch want := runnerTakesForbid(c); {
		case want && err != nil:
			t.Errorf("egress.forbid %q: %v; the runner takes it", c, err)
		case !want && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("egress.forbid: %q", c))):
			t.Errorf("egress.forbid %q: %v, want the render refused naming it (the runner refuses it)", c, err)
		}
	}
	if _, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true", "--set-string", "egress.forbid[0]=::ffff:10.0.0.0/8"); err == nil ||
		!strings.Contains(err.Error(), "IPv4-mapped prefix shorter than /96") {
		t.Errorf("egress.forbid ::ffff:10.0.0.0/8: %v, want the mapped prefix named", err)
	}
	// egress.clusterIP: an address the runner takes for --egress-*-addr (netip.ParseAddr; not
	// unspecified, loopback, link-local or multicast), and neither IPv4-mapped (the IPv4
	// address itself is the Service's clusterIP) nor in 0.0.0.0/8 (no destination).
	runnerTakesAddr := func(a string) bool {
		ip, err := netip.ParseAddr(a)
		return err == nil && ip.Zone() == "" && !ip.Is4In6() && !ip.IsUnspecified() && !ip.IsLoopback() && !ip.IsMulticast() &&
			!ip.IsLinkLocalUnicast() && !ip.IsLinkLocalMulticast() && !(ip.Is4() && ip.As4()[0] == 0)
	}
	for _, a := range []string{"10.96.0.53", "240.0.0.1", "fd00::53", "FD00:0:0:0:0:0:0:53", "fec0::1", "2001:db8::1.2.3.4",
		"10.96.0.300", "010.96.0.53", "0.0.0.1", "127.0.0.1", "169.254.1.1", "224.0.0.1", "239.255.255.255", "::", ":::", "::1", "0::01",
		"0:0:0:0:0:0:0:1", "fe80::1", "FE80::1", "febf::1", "ff02::1", "::ffff:10.96.0.53", "::ffff:a60:35", "1:2", "1::2::3", "fd00::12345",
		"fd00::1%eth0", "None"} {
		_, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true", "--set-string", "egress.clusterIP="+a)
		switch want := runnerTakesAddr(a); {
		case want && err != nil:
			t.Errorf("egress.clusterIP %q: %v; the runner takes it", a, err)
		case !want && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("egress.clusterIP %q", a))):
			t.Errorf("egress.clusterIP %q: %v, want the render refused naming it", a, err)
		}
	}

	if _, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true,egress.proxyPort=1024,egress.dnsPort=65535"); err != nil {
		t.Errorf("ports 1024 and 65535: %v", err)
	}
	// deployment.yaml checks egress.* before reading it, as egress.yaml does: rendered
	// without egress.yaml, a malformed egress is the check's message, not a template error.
	noEgress := t.TempDir()
	if err := os.CopyFS(noEgress, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(noEgress, "templates", "egress.yaml")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ set, err string }{
		{"egress=1", "egress: want a map"},
		{"egress.enabled=true,egress.networkPolicy=false", "egress.networkPolicy: want a map"},
		{"egress.enabled=1", "egress.enabled: want true or false"},
	} {
		out, err := osexec.Command(helm, "template", "sandboxd-runner", noEgress, "--namespace", "sandboxd", "--set", bad.set).CombinedOutput()
		if err == nil || !strings.Contains(string(out), bad.err) || !strings.Contains(string(out), "templates/deployment.yaml") {
			t.Errorf("deployment.yaml alone, %s: %v\n%s\nwant the render refused with %q", bad.set, err, out, bad.err)
		}
	}

	// The runner Pod's own resolvers (where the proxy resolves what it dials).
	dns, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true,dnsPolicy=None,dnsConfig.nameservers={192.0.2.53}")
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := runner(dns); d.Spec.Template.Spec.DNSPolicy != corev1.DNSNone || d.Spec.Template.Spec.DNSConfig == nil ||
		!slices.Equal(d.Spec.Template.Spec.DNSConfig.Nameservers, []string{"192.0.2.53"}) {
		t.Errorf("dnsPolicy/dnsConfig: %q %+v", d.Spec.Template.Spec.DNSPolicy, d.Spec.Template.Spec.DNSConfig)
	}
	if d, _ := runner(off); d.Spec.Template.Spec.DNSPolicy != "" || d.Spec.Template.Spec.DNSConfig != nil {
		t.Errorf("default: dnsPolicy %q dnsConfig %+v, want the cluster's", d.Spec.Template.Spec.DNSPolicy, d.Spec.Template.Spec.DNSConfig)
	}
	// A value that would inject an argument is refused, not rendered.
	for _, bad := range []string{"egress.clusterIP=10.96.0.53\n- --privileged", "egress.forbid[0]=10.0.0.0/8\n- --privileged"} {
		if _, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true", "--set-string", bad); err == nil || !strings.Contains(err.Error(), "egress.") {
			t.Errorf("%q: %v, want the render refused", bad, err)
		}
	}
}

func npPort(proto corev1.Protocol, port int32) networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(port)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

// TestChartNodeAgent (issue 21): the chart's nodeAgent values. Off (the default): no
// DaemonSet, no --node-agent-* args, no TLS volume, no `get` on nodes, no PSA label, and
// the other nodeAgent values change nothing. On: a DaemonSet in the release namespace on the
// nodeSelector's nodes (hostNetwork, the port as hostPort, root, the hostPaths mounted at
// their node paths, the server Secret read-only, `sandboxd node-agent` with --node from the
// downward API, the sandbox namespace, the runner ID, the port, the paths), whose Pods no
// selector of the runner's (Deployment, Service) matches; the runner's --node-agent-port and
// --node-agent-tls-dir with the client Secret mounted there; the ClusterRole grants `get`
// on nodes. Bad values fail the render naming the value. helm lint passes with it on.
func TestChartNodeAgent(t *testing.T) {
	helm := chartHelm(t)
	base := "nodeAgent.enabled=true,nodeAgent.runnerID=runner-1,nodeAgent.serverSecret=na-server,nodeAgent.clientSecret=na-client"
	for _, set := range []string{base, "nodeAgent.enabled=true,nodeAgent.runnerID=runner-1"} {
		if out, err := osexec.Command(helm, "lint", "--strict", chartDir, "--set", set).CombinedOutput(); err != nil {
			t.Errorf("helm lint %s: %v\n%s", set, err, out)
		}
	}
	nodeGet := func(r renderedChart) bool {
		t.Helper()
		for _, name := range r.named("ClusterRole") {
			var cr rbacv1.ClusterRole
			r.get(t, "ClusterRole/"+name, &cr)
			for _, rule := range cr.Rules {
				if slices.Contains(rule.Resources, "nodes") && slices.Contains(rule.Verbs, "get") {
					return true
				}
			}
		}
		return false
	}
	runner := func(r renderedChart) (appsv1.Deployment, corev1.Container) {
		t.Helper()
		var d appsv1.Deployment
		if names := r.named("Deployment"); len(names) != 1 || !r.get(t, "Deployment/"+names[0], &d) {
			t.Fatalf("want one Deployment in %v", r.keys())
		}
		return d, d.Spec.Template.Spec.Containers[0]
	}

	off, err := renderChart(t, helm, "sandboxd-runner", "--set", "namespace.create=true")
	if err != nil {
		t.Fatal(err)
	}
	if got := off.named("DaemonSet"); got != nil {
		t.Errorf("off: DaemonSets %v", got)
	}
	d, c := runner(off)
	if got := withPrefix(c.Args, "--node-agent"); got != nil {
		t.Errorf("off: args %q", got)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if strings.Contains(v.Name, "node-agent") {
			t.Errorf("off: volume %s", v.Name)
		}
	}
	if nodeGet(off) {
		t.Error("off: a ClusterRole grants get on nodes")
	}
	var ns corev1.Namespace
	if !off.get(t, "Namespace/sandboxd", &ns) {
		t.Fatalf("off: no Namespace in %v", off.keys())
	}
	if v, ok := ns.Labels["pod-security.kubernetes.io/enforce"]; ok {
		t.Errorf("off: the namespace enforces %q", v)
	}
	offSet, err := renderChart(t, helm, "sandboxd-runner", "--set", "namespace.create=true,nodeAgent.port=0,nodeAgent.runnerID=x,nodeAgent.nodeSelector=null,nodeAgent.shimRoot=rel")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(offSet, off) {
		t.Errorf("off with other nodeAgent values: %v, want %v", offSet.keys(), off.keys())
	}

	for _, tc := range []struct {
		name, release string
		set           []string
		sandboxNS     string
		port          int32
		selector      map[string]string
		paths         [4]string // shim root, checkpoint root, state dir, CRI socket
		prepullOff    bool
		extraArgs     []string
		runnerExtra   []string
		// issued: no Secrets named, the runner issues the certificates and keeps them in
		// <issuePrefix>-ca and <issuePrefix>-server.
		issuePrefix string
	}{
		{name: "defaults", release: "sandboxd-runner", set: []string{"--set", base + ",namespace.create=true"}, sandboxNS: "sandboxd", port: 7445,
			selector: map[string]string{"sandboxd.dev/gvisor": "true"},
			paths:    [4]string{"/run/containerd/runsc", "/var/lib/sandboxd/checkpoints", "/var/lib/sandboxd/node-agent", "/run/containerd/containerd.sock"}},
		{name: "moved, no pre-pull, other namespace", release: "foo",
			set: []string{"--set", base + ",nodeAgent.port=17445,sandboxNamespace=sbx,prepull.images=0,nodeAgent.nodeGoneAfter=10m",
				"--set", "nodeAgent.shimRoot=/data/hib,nodeAgent.checkpointRoot=/data/checkpoints,nodeAgent.stateDir=/data/na,nodeAgent.criSocket=/data/run/containerd.sock",
				"--set", `nodeAgent.nodeSelector.sandboxd\.dev/gvisor=null`, "--set-string", "nodeAgent.nodeSelector.pool=gvisor",
				"--set", "nodeAgent.extraArgs={--quota-bytes=1073741824}"},
			sandboxNS: "sbx", port: 17445, selector: map[string]string{"pool": "gvisor"}, prepullOff: true,
			paths:       [4]string{"/data/hib", "/data/checkpoints", "/data/na", "/data/run/containerd.sock"},
			extraArgs:   []string{"--quota-bytes=1073741824"},
			runnerExtra: []string{"--node-agent-node-gone-after=10m"}},
		{name: "issued", release: "issued", set: []string{"--set", "nodeAgent.enabled=true,nodeAgent.runnerID=runner-1"}, sandboxNS: "sandboxd", port: 7445,
			selector:    map[string]string{"sandboxd.dev/gvisor": "true"},
			paths:       [4]string{"/run/containerd/runsc", "/var/lib/sandboxd/checkpoints", "/var/lib/sandboxd/node-agent", "/run/containerd/containerd.sock"},
			issuePrefix: "issued-sandboxd-runner-node-agent"},
	} {
		r, err := renderChart(t, helm, tc.release, tc.set...)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		d, c := runner(r)
		tlsArg, serverSecret := "--node-agent-tls-dir=/etc/sandboxd/node-agent-tls", "na-server"
		if tc.issuePrefix != "" {
			tlsArg, serverSecret = "--node-agent-issue-secrets="+tc.issuePrefix, tc.issuePrefix+"-server"
		}
		wantArgs := append([]string{fmt.Sprintf("--node-agent-port=%d", tc.port), tlsArg}, tc.runnerExtra...)
		if got := withPrefix(c.Args, "--node-agent"); !slices.Equal(got, wantArgs) {
			t.Errorf("%s: runner args %q, want %q", tc.name, got, wantArgs)
		}
		mountsClient := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == "/etc/sandboxd/node-agent-tls" && m.ReadOnly && slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
				return v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == "na-client"
			})
		})
		if mountsClient != (tc.issuePrefix == "") {
			t.Errorf("%s: the runner mounts the Secret na-client at /etc/sandboxd/node-agent-tls: %v, want %v: %+v", tc.name, mountsClient, tc.issuePrefix == "", c.VolumeMounts)
		}
		if tc.issuePrefix != "" && slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return strings.Contains(v.Name, "node-agent") }) {
			t.Errorf("%s: the runner has a node-agent volume: %+v", tc.name, d.Spec.Template.Spec.Volumes)
		}
		// Secrets in the runner's own Role: with issued certificates, create (no name can
		// be given) and get, update on the two Secrets only; else none.
		var self rbacv1.Role
		if !r.get(t, "Role/"+d.Name+"-self", &self) {
			t.Fatalf("%s: no Role %s-self in %v", tc.name, d.Name, r.keys())
		}
		var secretRules []rbacv1.PolicyRule
		for _, rule := range self.Rules {
			if slices.Contains(rule.Resources, "secrets") {
				secretRules = append(secretRules, rule)
			}
		}
		var wantSecretRules []rbacv1.PolicyRule
		if tc.issuePrefix != "" {
			wantSecretRules = []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{tc.issuePrefix + "-ca", tc.issuePrefix + "-server"}, Verbs: []string{"get", "update"}},
			}
		}
		if !reflect.DeepEqual(secretRules, wantSecretRules) {
			t.Errorf("%s: the runner's own Role's Secret rules %+v, want %+v", tc.name, secretRules, wantSecretRules)
		}
		if !nodeGet(r) {
			t.Errorf("%s: no ClusterRole grants get on nodes", tc.name)
		}
		if tc.prepullOff {
			var cr rbacv1.ClusterRole
			if names := r.named("ClusterRole"); len(names) != 1 || !r.get(t, "ClusterRole/"+names[0], &cr) ||
				!reflect.DeepEqual(cr.Rules, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}) {
				t.Errorf("%s: ClusterRoles %v: want one granting get on nodes only", tc.name, r.named("ClusterRole"))
			}
			if len(r.named("ClusterRoleBinding")) != 1 {
				t.Errorf("%s: ClusterRoleBindings %v", tc.name, r.named("ClusterRoleBinding"))
			}
		}

		names := r.named("DaemonSet")
		var ds appsv1.DaemonSet
		if len(names) != 1 || !r.get(t, "DaemonSet/"+names[0], &ds) {
			t.Errorf("%s: DaemonSets %v", tc.name, names)
			continue
		}
		spec := ds.Spec.Template.Spec
		if ds.Namespace != "sandboxd" || !spec.HostNetwork || !reflect.DeepEqual(spec.NodeSelector, tc.selector) {
			t.Errorf("%s: DaemonSet namespace %q hostNetwork %v nodeSelector %v", tc.name, ds.Namespace, spec.HostNetwork, spec.NodeSelector)
		}
		// No selector of the runner's picks the agents' Pods.
		podLabels := ds.Spec.Template.Labels
		sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(podLabels)) {
			t.Errorf("%s: the DaemonSet's selector %v does not match its Pods %v", tc.name, ds.Spec.Selector, podLabels)
		}
		if rs, _ := metav1.LabelSelectorAsSelector(d.Spec.Selector); rs.Matches(labels.Set(podLabels)) {
			t.Errorf("%s: the runner Deployment's selector matches the agents' Pods %v", tc.name, podLabels)
		}
		for _, name := range r.named("Service") {
			var svc corev1.Service
			r.get(t, "Service/"+name, &svc)
			if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(podLabels)) {
				t.Errorf("%s: Service %s selects the agents' Pods", tc.name, name)
			}
		}
		if len(spec.Containers) != 1 {
			t.Fatalf("%s: containers %+v", tc.name, spec.Containers)
		}
		a := spec.Containers[0]
		if a.Image != c.Image {
			t.Errorf("%s: agent image %q, want the runner's %q", tc.name, a.Image, c.Image)
		}
		wantAgent := append([]string{"node-agent", "--node=$(NODE_NAME)", "--runner-id=runner-1", "--namespace=" + tc.sandboxNS,
			fmt.Sprintf("--listen=:%d", tc.port), "--tls-dir=/etc/sandboxd/node-agent-tls",
			"--shim-root=" + tc.paths[0], "--checkpoint-root=" + tc.paths[1], "--state-dir=" + tc.paths[2],
			"--cri-endpoint=unix://" + tc.paths[3], "--runtime-handler=runsc"}, tc.extraArgs...)
		if !slices.Equal(a.Args, wantAgent) {
			t.Errorf("%s: agent args %q, want %q", tc.name, a.Args, wantAgent)
		}
		if len(a.Env) != 1 || a.Env[0].Name != "NODE_NAME" || a.Env[0].ValueFrom == nil || a.Env[0].ValueFrom.FieldRef == nil ||
			a.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
			t.Errorf("%s: agent env %+v, want NODE_NAME from spec.nodeName", tc.name, a.Env)
		}
		if want := []corev1.ContainerPort{{Name: "node-agent", ContainerPort: tc.port, HostPort: tc.port}}; !reflect.DeepEqual(a.Ports, want) {
			t.Errorf("%s: agent ports %+v, want %+v", tc.name, a.Ports, want)
		}
		if sc := a.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
			t.Errorf("%s: agent securityContext %+v, want root", tc.name, sc)
		}
		// Each volume: hostPath (type) or the server Secret, mounted where the flag says.
		vols := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			vols[v.Name] = v
		}
		wantMounts := map[string]struct {
			hostPath string
			typ      corev1.HostPathType
			secret   string
			readOnly bool
		}{
			"/etc/sandboxd/node-agent-tls": {secret: serverSecret, readOnly: true},
			tc.paths[0]:                    {hostPath: tc.paths[0], typ: corev1.HostPathDirectory},
			tc.paths[1]:                    {hostPath: tc.paths[1], typ: corev1.HostPathDirectoryOrCreate},
			tc.paths[2]:                    {hostPath: tc.paths[2], typ: corev1.HostPathDirectoryOrCreate},
			tc.paths[3]:                    {hostPath: tc.paths[3], typ: corev1.HostPathSocket},
		}
		if len(a.VolumeMounts) != len(wantMounts) || len(spec.Volumes) != len(wantMounts) {
			t.Errorf("%s: mounts %+v volumes %+v", tc.name, a.VolumeMounts, spec.Volumes)
		}
		for _, m := range a.VolumeMounts {
			w, ok := wantMounts[m.MountPath]
			v := vols[m.Name]
			switch {
			case !ok:
				t.Errorf("%s: unexpected mount %s", tc.name, m.MountPath)
			case w.secret != "":
				if v.Secret == nil || v.Secret.SecretName != w.secret || !m.ReadOnly {
					t.Errorf("%s: mount %s: %+v, want Secret %s read-only", tc.name, m.MountPath, v, w.secret)
				}
			default:
				if v.HostPath == nil || v.HostPath.Path != w.hostPath || v.HostPath.Type == nil || *v.HostPath.Type != w.typ {
					t.Errorf("%s: mount %s: %+v, want hostPath %s type %s", tc.name, m.MountPath, v.VolumeSource, w.hostPath, w.typ)
				}
			}
		}
		if tc.release == "sandboxd-runner" {
			var ns corev1.Namespace
			if !r.get(t, "Namespace/sandboxd", &ns) || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
				t.Errorf("%s: the created namespace's labels %v: want enforce=privileged (the DaemonSet's Pods)", tc.name, ns.Labels)
			}
		}
	}

	for _, bad := range []struct{ set, err string }{
		{"nodeAgent=1", "nodeAgent: want a map"},
		{"nodeAgent.enabled=yes", "nodeAgent.enabled: want true or false"},
		{"nodeAgent.enabled=true,nodeAgent.serverSecret=a,nodeAgent.clientSecret=b", `nodeAgent.runnerID "": want the runner's ID`},
		{"nodeAgent.runnerID=-bad", `nodeAgent.runnerID "-bad"`},
		{"nodeAgent.port=0", "nodeAgent.port: want a port 1-65535, got 0"},
		{"nodeAgent.port=65536", "nodeAgent.port: want a port 1-65535"},
		{"nodeAgent.port=abc", "nodeAgent.port: want a port 1-65535"},
		{"nodeAgent.serverSecret=", `nodeAgent.serverSecret "" and nodeAgent.clientSecret "na-client": name both (certificates you made) or neither`},
		{"nodeAgent.clientSecret=", `nodeAgent.serverSecret "na-server" and nodeAgent.clientSecret "": name both`},
		{"nodeAgent.serverSecret=1", `nodeAgent.serverSecret: want the name of a kubernetes.io/tls Secret (with ca.crt) in the release namespace, or ""`},
		{"nodeAgent.clientSecret=Bad_Name", `nodeAgent.clientSecret "Bad_Name": want a Secret name`},
		{"nodeAgent.clientSecret=na-server", "nodeAgent.serverSecret and nodeAgent.clientSecret: both"},
		{"nodeAgent.nodeSelector=null", "nodeAgent.nodeSelector: want a non-empty map"},
		{"nodeAgent.nodeSelector=gvisor", "nodeAgent.nodeSelector: want a non-empty map"},
		{"nodeAgent.nodeSelector.sandboxd\\.dev/gvisor=true", "nodeAgent.nodeSelector.sandboxd.dev/gvisor: want a string"},
		{"nodeAgent.tolerations=x", "nodeAgent.tolerations: want a list"},
		{"nodeAgent.shimRoot=run/runsc", `nodeAgent.shimRoot "run/runsc": want an absolute, clean host path`},
		{"nodeAgent.checkpointRoot=/var/lib/../x", `nodeAgent.checkpointRoot "/var/lib/../x": want an absolute, clean host path`},
		{"nodeAgent.stateDir=/var/lib/sandboxd/", `nodeAgent.stateDir "/var/lib/sandboxd/": want an absolute, clean host path`},
		{"nodeAgent.criSocket=/run/x sock", `nodeAgent.criSocket "/run/x sock"`},
		{"nodeAgent.stateDir=/var/lib/sandboxd/checkpoints/state", "nodeAgent.checkpointRoot \"/var/lib/sandboxd/checkpoints\" and nodeAgent.stateDir"},
		{"nodeAgent.criSocket=/etc/sandboxd/node-agent-tls/s", "the agent's TLS Secret is mounted there"},
		{"nodeAgent.runtimeHandler=", `nodeAgent.runtimeHandler "": want a CRI runtime handler name`},
		{"nodeAgent.nodeGoneAfter=soon", `nodeAgent.nodeGoneAfter "soon": want a duration`},
		{"nodeAgent.extraArgs=--v", "nodeAgent.extraArgs: want a list"},
		{"nodeAgent.securityContext=root", "nodeAgent.securityContext: want a container securityContext"},
	} {
		set := base + "," + bad.set
		if strings.HasPrefix(bad.set, "nodeAgent=") || strings.HasPrefix(bad.set, "nodeAgent.enabled=") {
			set = bad.set
		}
		_, err := renderChart(t, helm, "sandboxd-runner", "--set", set)
		if err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("%s: %v, want the render refused with %q", bad.set, err, bad.err)
		}
	}
	// A value that would inject an argument or YAML is refused, not rendered.
	for _, bad := range []string{"nodeAgent.runnerID=r1\n- --privileged", "nodeAgent.shimRoot=/run\n  privileged: true", "nodeAgent.nodeGoneAfter=5m\n- --x"} {
		if _, err := renderChart(t, helm, "sandboxd-runner", "--set", base, "--set-string", bad); err == nil || !strings.Contains(err.Error(), "nodeAgent.") {
			t.Errorf("%q: %v, want the render refused", bad, err)
		}
	}
}

// TestChartEgressExtraArgs: with egress.enabled the chart sets the runner's --egress-*
// flags itself, so extraArgs holding one (either dash form) fails the render naming it
// (the runner would take the last of two and silently override the chart's); without
// egress, or with other flags, extraArgs renders as given.
func TestChartEgressExtraArgs(t *testing.T) {
	helm := chartHelm(t)
	for _, a := range []string{"--egress-proxy-listen=:15000", "--egress-dns-addr=10.96.0.53", "-egress-forbid=10.0.0.0/8", "--egress-proxy-addr"} {
		_, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true", "--set-string", "extraArgs[0]=--log-level=debug", "--set-string", "extraArgs[1]="+a)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("extraArgs: %q: with egress.enabled the chart sets the runner's --egress-* flags itself", a)) {
			t.Errorf("egress on, extraArgs %q: %v, want the render refused naming it", a, err)
		}
		if _, err := renderChart(t, helm, "sandboxd-runner", "--set-string", "extraArgs[0]="+a); err != nil {
			t.Errorf("egress off, extraArgs %q: %v, want it rendered", a, err)
		}
	}
	r, err := renderChart(t, helm, "sandboxd-runner", "--set", "egress.enabled=true", "--set-string", "extraArgs[0]=--log-level=debug")
	if err != nil {
		t.Fatalf("egress on, other extraArgs: %v", err)
	}
	var d appsv1.Deployment
	if names := r.named("Deployment"); len(names) != 1 || !r.get(t, "Deployment/"+names[0], &d) || !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--log-level=debug") {
		t.Errorf("egress on, extraArgs --log-level=debug: not among the runner's args")
	}
}
