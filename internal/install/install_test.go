package install_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/install"
)

func TestNamespace(t *testing.T) {
	a, b := install.Namespace("org-a", "r1"), install.Namespace("org-b", "r1")
	if a == b || !strings.HasPrefix(a, "sandboxd-r1-") || len(a) != len("sandboxd-r1-")+8 {
		t.Fatalf("two organizations' r1: %s %s", a, b)
	}
	// The hash separates organization and runner ("/"): moving a character across is another name.
	if install.Namespace("a", "bc") == install.Namespace("ab", "c") {
		t.Fatal("org/runner boundary lost")
	}
	long := "r" + strings.Repeat("a", 61) + "z" // the longest runner id: 63
	for _, id := range []string{long, long[:62] + "b", strings.Repeat("a", 44) + "-" + strings.Repeat("b", 18)} {
		got := install.Namespace("org-a", id)
		if len(got) > 63 || !strings.HasPrefix(got, "sandboxd-") || !dnsLabel.MatchString(got) {
			t.Fatalf("%s: %s (%d)", id, got, len(got))
		}
	}
	if install.Namespace("org-a", long) == install.Namespace("org-a", long[:62]+"b") {
		t.Fatal("two long ids, one namespace")
	}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestOwned(t *testing.T) {
	v := install.Values{Org: "any org/ id", RunnerID: "r1", Namespace: install.Namespace("any org/ id", "r1")}
	for _, o := range install.Objects(v) {
		u, err := install.Unstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		if !install.Owned(u.GetLabels(), v.Org, "r1") || install.Owned(u.GetLabels(), "other", "r1") || install.Owned(u.GetLabels(), v.Org, "r2") {
			t.Fatalf("%s labels %v", u.GetKind(), u.GetLabels())
		}
		if h := u.GetLabels()[install.OrgLabel]; len(h) > 63 || !dnsLabel.MatchString(h) || u.GetAnnotations()[install.OrgAnnotation] != v.Org {
			t.Fatalf("%s org label %q", u.GetKind(), h)
		}
	}
	if install.Owned(nil, "", "") {
		t.Fatal("no labels owned")
	}
}

func TestObjects(t *testing.T) {
	v := install.Values{RunnerID: "r1", Namespace: "sandboxd-r1", Image: "img:1", AgentImage: "agent:1", ControlPlane: "cp:8443",
		BootstrapToken: "tok", CAPEM: "pem", StorageClass: "fast", ExtraArgs: []string{"--heartbeat-interval=1s"}}
	objs := install.Objects(v)
	var d *appsv1.Deployment
	var sec *corev1.Secret
	for _, o := range objs {
		u, err := install.Unstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		if u.GetLabels()[install.RunnerLabel] != "r1" || u.GetLabels()["app.kubernetes.io/managed-by"] != install.ManagedBy {
			t.Fatalf("%s labels %v", u.GetKind(), u.GetLabels())
		}
		if _, ok := u.Object["status"]; ok {
			t.Fatalf("%s carries a status", u.GetKind())
		}
		clusterScoped := u.GetKind() == "Namespace" || u.GetKind() == "ClusterRole" || u.GetKind() == "ClusterRoleBinding"
		if clusterScoped != (u.GetNamespace() == "") || !clusterScoped && u.GetNamespace() != "sandboxd-r1" {
			t.Fatalf("%s in %q", u.GetKind(), u.GetNamespace())
		}
		switch x := o.(type) {
		case *appsv1.Deployment:
			d = x
		case *corev1.Secret:
			sec = x
		}
	}
	if d == nil || sec == nil || sec.StringData["bootstrap-token"] != "tok" || sec.StringData["ca.pem"] != "pem" || sec.StringData["address"] != "cp:8443" {
		t.Fatalf("secret %+v", sec)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "img:1" || !slices.Contains(c.Args, "--namespace=sandboxd-r1") || !slices.Contains(c.Args, "--agent-image=agent:1") ||
		!slices.Contains(c.Args, "--control-plane-ca=/etc/sandboxd/control-plane/ca.pem") || c.Args[len(c.Args)-1] != "--heartbeat-interval=1s" {
		t.Fatalf("container %v %v", c.Image, c.Args)
	}
	if *c.SecurityContext.ReadOnlyRootFilesystem != true || *d.Spec.Template.Spec.SecurityContext.RunAsNonRoot != true {
		t.Fatal("security context")
	}
	// Without a CA, no CA argument or volume (the chart's caPEM unset).
	v.CAPEM = ""
	for _, o := range install.Objects(v) {
		if d, ok := o.(*appsv1.Deployment); ok {
			if slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--control-plane-ca") }) ||
				len(d.Spec.Template.Spec.Volumes) != 2 {
				t.Fatalf("without CA: %v", d.Spec.Template.Spec.Containers[0].Args)
			}
		}
	}
}

func TestDiagnose(t *testing.T) {
	ns := schema.GroupResource{Resource: "namespaces"}
	for _, tc := range []struct {
		err    error
		reason string
		hint   string
	}{
		{&install.ApplyError{Kind: "Namespace", Name: "x", Err: apierrors.NewForbidden(ns, "x", errors.New("no"))}, apierr.InstallForbidden, "lacks RBAC to create namespaces (cluster-wide)"},
		{&install.ApplyError{Kind: "Role", Name: "x", Namespace: "n", Err: apierrors.NewForbidden(ns, "x", errors.New("no"))}, apierr.InstallForbidden, "roles (in namespace n)"},
		{&install.ApplyError{Kind: "Namespace", Name: "x", Delete: true, Err: apierrors.NewForbidden(ns, "x", errors.New("no"))}, apierr.InstallForbidden, "to delete namespaces"},
		{apierrors.NewUnauthorized("x"), apierr.InstallUnauthenticated, "does not accept"},
		{apierrors.NewConflict(ns, "x", errors.New("c")), apierr.InstallConflict, "another manager"},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "Deployment"}, "x", nil), apierr.InstallRejected, "--install-runner-image"},
		{errors.New("dial tcp: refused"), apierr.InstallFailed, "reaches the cluster"},
	} {
		d := install.Diagnose(tc.err)
		if d.Reason != tc.reason || !strings.Contains(strings.Join(d.Hints, "\n"), tc.hint) {
			t.Errorf("%v: %+v, want %s with %q", tc.err, d, tc.reason, tc.hint)
		}
	}
}

// FuzzNamespace: for any organization id and any valid runner id, the namespace is a DNS
// label of at most 63 characters, another organization's differs, and the org label is a
// valid label value.
func FuzzNamespace(f *testing.F) {
	for _, s := range [][2]string{{"platform", "r1"}, {"", "a"}, {"org/with slash", "r" + strings.Repeat("x", 62)}, {"ü", strings.Repeat("a", 45) + "-b"}} {
		f.Add(s[0], s[1])
	}
	runnerID := regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`) // the control plane's runner id syntax
	f.Fuzz(func(t *testing.T, org, id string) {
		if !runnerID.MatchString(id) {
			return
		}
		ns := install.Namespace(org, id)
		if len(ns) > 63 || !dnsLabel.MatchString(ns) {
			t.Fatalf("%q %q: %q", org, id, ns)
		}
		if install.Namespace(org+"x", id) == ns {
			t.Fatalf("%q and %q's %s share %s", org, org+"x", id, ns)
		}
		if h := install.OrgHash(org); len(h) > 63 || !dnsLabel.MatchString(h) {
			t.Fatalf("org label %q", h)
		}
	})
}

// helloOf is a runner container's gate-hello settings (docs/hardening.md): its
// --hello-listen and --hello-addr, its POD_IP variable and its UDP port "hello". An
// error names what is missing or disagrees.
func helloOf(c corev1.Container) (port int32, err error) {
	var listen, addr []string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--hello-listen="); ok {
			listen = append(listen, v)
		}
		if v, ok := strings.CutPrefix(a, "--hello-addr="); ok {
			addr = append(addr, v)
		}
	}
	var ports []corev1.ContainerPort
	for _, p := range c.Ports {
		if p.Name == "hello" {
			ports = append(ports, p)
		}
	}
	if len(ports) != 1 || ports[0].Protocol != corev1.ProtocolUDP {
		return 0, fmt.Errorf("want one UDP port named hello, have %+v", c.Ports)
	}
	port = ports[0].ContainerPort
	p := strconv.Itoa(int(port))
	if !slices.Equal(listen, []string{":" + p}) || !slices.Equal(addr, []string{"[$(POD_IP)]:" + p}) {
		return 0, fmt.Errorf("want --hello-listen=:%s --hello-addr=[$(POD_IP)]:%s, have %q %q", p, p, listen, addr)
	}
	// $(POD_IP) expands only from a variable defined before it is used in args (all are).
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
	}) {
		return 0, fmt.Errorf("no POD_IP from status.podIP in %+v", c.Env)
	}
	return port, nil
}

// peerPodsMatch checks that the runner's --runner-peer-pods selects its own Pods: the
// sandboxes' NetworkPolicies let the hello (and the agent channel) reach exactly them.
func peerPodsMatch(d *appsv1.Deployment) error {
	c := d.Spec.Template.Spec.Containers[0]
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--runner-peer-pods="); ok {
			sel, err := labels.Parse(v)
			if err != nil {
				return err
			}
			if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				return fmt.Errorf("--runner-peer-pods=%s does not select the runner's Pods %v", v, d.Spec.Template.Labels)
			}
			return nil
		}
	}
	return errors.New("no --runner-peer-pods")
}

// TestHelloCopiesAgree: the installer's runner and the plain manifest's (the chart's
// default rendering; test/k8s TestChartHello renders the chart itself) both turn the
// gate's hello on, on the same UDP port, to the Pod's IP, and the sandboxes' NetworkPolicy
// peer (--runner-peer-pods) selects the runner's Pods. One copy lacking a setting fails.
func TestHelloCopiesAgree(t *testing.T) {
	var installer, manifest *appsv1.Deployment
	for _, o := range install.Objects(install.Values{Namespace: "sandboxd", Image: "i", AgentImage: "a"}) {
		if d, ok := o.(*appsv1.Deployment); ok {
			installer = d
		}
	}
	raw, err := os.ReadFile("../../deploy/kubernetes/runner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for doc := range bytes.SplitSeq(raw, []byte("\n---")) {
		var d appsv1.Deployment
		if err := yaml.Unmarshal(doc, &d); err == nil && d.Kind == "Deployment" {
			manifest = &d
		}
	}
	if installer == nil || manifest == nil {
		t.Fatalf("Deployments: installer %v, manifest %v", installer != nil, manifest != nil)
	}
	ports := map[string]int32{}
	for name, d := range map[string]*appsv1.Deployment{"installer": installer, "manifest": manifest} {
		c := d.Spec.Template.Spec.Containers[0]
		port, err := helloOf(c)
		if err != nil {
			t.Errorf("the %s's runner: %v", name, err)
		}
		ports[name] = port
		if err := peerPodsMatch(d); err != nil {
			t.Errorf("the %s's runner: %v", name, err)
		}
	}
	if ports["installer"] != install.HelloPort || ports["manifest"] != install.HelloPort {
		t.Errorf("hello ports %v, want %d in each", ports, install.HelloPort)
	}
}

// TestRuntimeClasses: a runtimeClasses value becomes one --runtime-classes argument, runc
// first and the rest in name order (whatever the map's order), none for an empty value;
// the list syntax (--install-runtime-classes) parses to the map it renders from; bad values
// are refused naming what is wrong.
func TestRuntimeClasses(t *testing.T) {
	m := map[string]string{"kata": "kata-qemu", "gvisor": "gvisor", "runc": ""}
	const want = "--runtime-classes=runc=,gvisor=gvisor,kata=kata-qemu"
	for range 20 { // map order varies between iterations
		if got := install.RuntimeClassesArg(m); got != want {
			t.Fatalf("RuntimeClassesArg = %q, want %q", got, want)
		}
	}
	if got := install.RuntimeClassesArg(nil); got != "" {
		t.Errorf("RuntimeClassesArg(nil) = %q", got)
	}
	if got := install.RuntimeClassesArg(map[string]string{"runc": "runc-rc"}); got != "--runtime-classes=runc=runc-rc" {
		t.Errorf("runc only: %q", got)
	}
	args := func(v install.Values) []string {
		var out []string
		for _, a := range install.Args(v) {
			if strings.HasPrefix(a, "--runtime-classes") {
				out = append(out, a)
			}
		}
		return out
	}
	v := install.Values{Namespace: "sandboxd", Image: "i", AgentImage: "a"}
	if got := args(v); got != nil {
		t.Errorf("no runtime classes: args %q", got)
	}
	v.RuntimeClasses = m
	if got := args(v); !slices.Equal(got, []string{want}) {
		t.Errorf("args %q, want %q", got, want)
	}
	v.RuntimeClasses = map[string]string{}
	if got := args(v); got != nil {
		t.Errorf("empty runtime classes: args %q", got)
	}

	got, err := install.ParseRuntimeClasses(" runc= , gvisor=gvisor,kata=kata-qemu")
	if err != nil || install.RuntimeClassesArg(got) != want {
		t.Errorf("ParseRuntimeClasses: %v, %v", got, err)
	}
	if got, err := install.ParseRuntimeClasses(" "); got != nil || err != nil {
		t.Errorf(`ParseRuntimeClasses(" "): %v, %v`, got, err)
	}
	for _, c := range []struct{ list, err string }{
		{"gvisor=gvisor", "no entry for runc"},
		{"runc=,Gvisor=gvisor", `runtime class "Gvisor": want a DNS label`},
		{"runc=,gvisor=gVisor", `runtime class "gvisor": RuntimeClass name "gVisor": want a DNS subdomain`},
		{"runc=,gvisor=a..b", `RuntimeClass name "a..b"`},
		{"runc=,=gvisor", `"=gvisor": want class=RuntimeClass`},
		{"runc=,gvisor", `"gvisor": want class=RuntimeClass`},
		{"runc=,gvisor=a,gvisor=b", `class "gvisor" given twice`},
		{"runc=," + strings.Repeat("g", 64) + "=gvisor", "want a DNS label"},
	} {
		if _, err := install.ParseRuntimeClasses(c.list); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%q: %v, want %q", c.list, err, c.err)
		}
	}
	if err := install.CheckRuntimeClasses(nil); err != nil {
		t.Errorf("CheckRuntimeClasses(nil): %v", err)
	}
	// At most MaxRuntimeClasses: that many pass, one more is refused, as a map and as a list.
	many := map[string]string{"runc": ""}
	for i := 1; len(many) < install.MaxRuntimeClasses; i++ {
		many[fmt.Sprintf("c%d", i)] = fmt.Sprintf("rc%d", i)
	}
	list := strings.TrimPrefix(install.RuntimeClassesArg(many), install.RuntimeClassesFlag+"=")
	if got, err := install.ParseRuntimeClasses(list); err != nil || !maps.Equal(got, many) {
		t.Errorf("%d classes: %v, %v", len(many), got, err)
	}
	if _, err := install.ParseRuntimeClasses(list + ",one-more=x"); err == nil || !strings.Contains(err.Error(), "more than 16 classes") {
		t.Errorf("%d classes: %v, want refused", len(many)+1, err)
	}
	many["one-more"] = "x"
	if err := install.CheckRuntimeClasses(many); err == nil || !strings.Contains(err.Error(), "17 classes, want at most 16") {
		t.Errorf("CheckRuntimeClasses of %d classes: %v, want refused", len(many), err)
	}
}

// TestRuntimeClassesCopiesAgree: the plain manifest (the chart's default rendering; test/k8s
// TestChartRuntimeClasses renders the chart itself) passes no --runtime-classes, as the
// installer does by default, and its commented gVisor example is exactly the argument the
// installer renders for {runc: "", gvisor: gvisor}.
func TestRuntimeClassesCopiesAgree(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/kubernetes/runner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var manifest *appsv1.Deployment
	for doc := range bytes.SplitSeq(raw, []byte("\n---")) {
		var d appsv1.Deployment
		if err := yaml.Unmarshal(doc, &d); err == nil && d.Kind == "Deployment" {
			manifest = &d
		}
	}
	if manifest == nil {
		t.Fatal("no Deployment in the manifest")
	}
	for _, a := range manifest.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--runtime-classes") {
			t.Errorf("the manifest passes %q", a)
		}
	}
	for _, a := range install.Args(install.Values{Namespace: "sandboxd", Image: "i", AgentImage: "a"}) {
		if strings.HasPrefix(a, "--runtime-classes") {
			t.Errorf("the installer passes %q by default", a)
		}
	}
	example := regexp.MustCompile(`(?m)^ +# - (--runtime-classes=\S*)$`).FindAllSubmatch(raw, -1)
	want := install.RuntimeClassesArg(map[string]string{"runc": "", "gvisor": "gvisor"})
	if len(example) != 1 || string(example[0][1]) != want {
		t.Errorf("the manifest's commented example %q, want one %q", example, want)
	}
}

// TestObjectsConfigMapRules: the sandbox Role lets the runner create ConfigMaps and get
// and update only its own egress roots ConfigMap.
func TestObjectsConfigMapRules(t *testing.T) {
	v := install.Values{RunnerID: "r1", Namespace: "sandboxd-r1", Image: "img:1", AgentImage: "agent:1", ControlPlane: "cp:8443", BootstrapToken: "tok"}
	var got []rbacv1.PolicyRule
	for _, o := range install.Objects(v) {
		if r, ok := o.(*rbacv1.Role); ok && strings.HasSuffix(r.Name, "-sandboxes") {
			for _, rule := range r.Rules {
				if slices.Contains(rule.Resources, "configmaps") {
					got = append(got, rule)
				}
			}
		}
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"sandboxd-egress-roots-r1"}, Verbs: []string{"get", "update"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("configmaps rules %+v, want %+v", got, want)
	}
}
