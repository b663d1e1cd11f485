package install_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// egressParts are the egress objects and settings of an install's objects.
type egressParts struct {
	svc      *corev1.Service
	np       *networkingv1.NetworkPolicy
	deploy   *appsv1.Deployment
	args     []string // --egress-*
	ports    []corev1.ContainerPort
	order    []string // Kind/name, in apply order
	egressAt int      // index in order of the first egress object; -1 none
}

func egressOf(t *testing.T, objs []runtime.Object) egressParts {
	t.Helper()
	p := egressParts{egressAt: -1}
	for _, o := range objs {
		k, m := key(o)
		p.order = append(p.order, k)
		if m.GetName() == install.EgressName && p.egressAt < 0 {
			p.egressAt = len(p.order) - 1
		}
		switch x := o.(type) {
		case *corev1.Service:
			if x.Name == install.EgressName {
				p.svc = x
			}
		case *networkingv1.NetworkPolicy:
			p.np = x
		case *appsv1.Deployment:
			p.deploy = x
		}
	}
	if p.deploy == nil {
		t.Fatalf("no Deployment in %v", p.order)
	}
	c := p.deploy.Spec.Template.Spec.Containers[0]
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--egress") {
			p.args = append(p.args, a)
		}
	}
	for _, cp := range c.Ports {
		if strings.HasPrefix(cp.Name, "egress") {
			p.ports = append(p.ports, cp)
		}
	}
	return p
}

// TestObjectsEgress: off (the default), the install has no egress Service, NetworkPolicy,
// args, ports or enableServiceLinks; on, it has them as the chart's egress.enabled renders
// them (test/k8s TestChartEgressCopiesAgree compares with the chart itself): the args name
// the variable the kubelet sets for the Service (its name upper-cased, '-' as '_'), the
// objects come before the Deployment, the NetworkPolicy admits the proxy and DNS from the
// backend's sandbox Pods of the runner's namespace only (not its pre-pull Pods) and every
// other port of the runner's container from anywhere.
func TestObjectsEgress(t *testing.T) {
	v := values("org-a", "r1")
	off := egressOf(t, install.Objects(v))
	if off.svc != nil || off.np != nil || off.args != nil || off.ports != nil || off.egressAt >= 0 ||
		off.deploy.Spec.Template.Spec.EnableServiceLinks != nil {
		t.Fatalf("off: %v args %q ports %v links %v", off.order, off.args, off.ports, off.deploy.Spec.Template.Spec.EnableServiceLinks)
	}

	v.Egress = true
	on := egressOf(t, install.Objects(v))
	if on.svc == nil || on.np == nil {
		t.Fatalf("on: objects %v", on.order)
	}
	if last := on.order[len(on.order)-1]; last != "Deployment/"+install.ReleaseName || on.egressAt > len(on.order)-2 {
		t.Errorf("on: order %v: the egress objects before the Deployment, which comes last", on.order)
	}
	const serviceVar = "$(SANDBOXD_RUNNER_EGRESS_SERVICE_HOST)"
	if install.EgressName != "sandboxd-runner-egress" || install.EgressAddr != serviceVar {
		t.Errorf("EgressName %q EgressAddr %q", install.EgressName, install.EgressAddr)
	}
	wantArgs := []string{"--egress-proxy-listen=:15443", "--egress-dns-listen=:5353", "--egress-proxy-addr=" + serviceVar, "--egress-dns-addr=" + serviceVar}
	if !slices.Equal(on.args, wantArgs) {
		t.Errorf("on: args %q, want %q", on.args, wantArgs)
	}
	// Where the chart writes them: after the hello's, before --self-deployment.
	all := on.deploy.Spec.Template.Spec.Containers[0].Args
	at := slices.Index(all, wantArgs[0])
	if at < 1 || !strings.HasPrefix(all[at-1], "--hello-addr=") || !strings.HasPrefix(all[at+len(wantArgs)], "--self-deployment=") {
		t.Errorf("on: args %q", all)
	}
	if links := on.deploy.Spec.Template.Spec.EnableServiceLinks; links == nil || !*links {
		t.Errorf("on: enableServiceLinks %v", links)
	}
	wantPorts := []corev1.ContainerPort{{Name: "egress-proxy", ContainerPort: 15443},
		{Name: "egress-dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}, {Name: "egress-dns-tcp", ContainerPort: 5353}}
	if !reflect.DeepEqual(on.ports, wantPorts) {
		t.Errorf("on: ports %v, want %v", on.ports, wantPorts)
	}
	podLabels := labels.Set(on.deploy.Spec.Template.Labels)
	svc := on.svc
	if svc.Namespace != v.Namespace || svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.ClusterIP != "" ||
		!labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || !install.Owned(svc.Labels, "org-a", "r1") {
		t.Errorf("on: Service %+v", svc)
	}
	wantSvc := []corev1.ServicePort{
		{Name: "proxy", Port: 443, TargetPort: intstr.FromString("egress-proxy"), Protocol: corev1.ProtocolTCP},
		{Name: "dns", Port: 53, TargetPort: intstr.FromString("egress-dns"), Protocol: corev1.ProtocolUDP},
		{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromString("egress-dns-tcp"), Protocol: corev1.ProtocolTCP},
	}
	if !reflect.DeepEqual(svc.Spec.Ports, wantSvc) {
		t.Errorf("on: Service ports %+v", svc.Spec.Ports)
	}

	np := on.np
	if np.Name != install.EgressName || np.Namespace != v.Namespace || !install.Owned(np.Labels, "org-a", "r1") {
		t.Errorf("on: NetworkPolicy %s/%s labels %v", np.Namespace, np.Name, np.Labels)
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !sel.Matches(podLabels) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Fatalf("on: NetworkPolicy selects %v (%v) types %v", np.Spec.PodSelector, err, np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 2 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[1].From != nil {
		t.Fatalf("on: ingress %+v", np.Spec.Ingress)
	}
	// The sandbox rule's peer: the backend's sandbox Pods in the runner's namespace.
	peer := np.Spec.Ingress[0].From[0]
	if peer.NamespaceSelector == nil || !reflect.DeepEqual(peer.NamespaceSelector.MatchLabels, map[string]string{corev1.LabelMetadataName: v.Namespace}) {
		t.Errorf("on: peer namespaces %v", peer.NamespaceSelector)
	}
	pods, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	sandbox := labels.Set{kubernetes.LabelManagedBy: kubernetes.ManagedBy, kubernetes.LabelSandbox: "sb1"}
	prepull := labels.Set{kubernetes.LabelManagedBy: kubernetes.ManagedBy}
	if !pods.Matches(sandbox) || pods.Matches(prepull) || pods.Matches(podLabels) {
		t.Errorf("on: peer %v: want the sandbox Pods only", peer.PodSelector)
	}
	npPort := func(proto corev1.Protocol, p int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: new(intstr.FromInt32(p))}
	}
	if want := []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, 15443), npPort(corev1.ProtocolUDP, 5353), npPort(corev1.ProtocolTCP, 5353)}; !reflect.DeepEqual(np.Spec.Ingress[0].Ports, want) {
		t.Errorf("on: sandbox ports %+v", np.Spec.Ingress[0].Ports)
	}
	// Every port of the runner's container, and its metrics listener, is admitted.
	c := on.deploy.Spec.Template.Spec.Containers[0]
	admitted := append(slices.Clone(np.Spec.Ingress[0].Ports), np.Spec.Ingress[1].Ports...)
	for _, p := range append(slices.Clone(c.Ports), corev1.ContainerPort{Name: "metrics", ContainerPort: 9467}) {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		if !slices.ContainsFunc(admitted, func(q networkingv1.NetworkPolicyPort) bool {
			return reflect.DeepEqual(q, npPort(proto, p.ContainerPort))
		}) {
			t.Errorf("on: the runner's port %s %d/%s is not admitted", p.Name, p.ContainerPort, proto)
		}
	}
	if !slices.Contains(c.Args, "--metrics-listen=0.0.0.0:9467") {
		t.Errorf("metrics listener moved: %q", c.Args)
	}
}

// TestApplyEgress: on, Apply applies the egress Service and NetworkPolicy (before the
// Deployment) and deletes nothing in the namespace; off, it applies neither and deletes
// both from the runner's namespace after applying everything else, on every install.
func TestApplyEgress(t *testing.T) {
	ctx := context.Background()
	v := values("org-a", "r1")
	ns := v.Namespace
	c := newMemCluster()
	v.Egress = true
	if err := install.Apply(ctx, c, v); err != nil {
		t.Fatal(err)
	}
	svc, np, dep := "apply Service/"+ns+"/"+install.EgressName, "apply NetworkPolicy/"+ns+"/"+install.EgressName, "apply Deployment/"+ns+"/"+install.ReleaseName
	if i, j, k := slices.Index(c.events, svc), slices.Index(c.events, np), slices.Index(c.events, dep); i < 0 || j < 0 || k < i || k < j || c.nsDeleted != nil {
		t.Fatalf("on: %v, deleted %v", c.events, c.nsDeleted)
	}
	v.Egress = false
	for range 2 { // turned off, and again: each install deletes them (missing is fine)
		c.events, c.nsDeleted = nil, nil
		if err := install.Apply(ctx, c, v); err != nil {
			t.Fatal(err)
		}
		want := []string{"NetworkPolicy/" + ns + "/" + install.EgressName, "Service/" + ns + "/" + install.EgressName}
		if !slices.Equal(c.nsDeleted, want) || slices.Contains(c.events, svc) || slices.Contains(c.events, np) {
			t.Fatalf("off: %v, deleted %v, want %v", c.events, c.nsDeleted, want)
		}
		if last := c.events[len(c.events)-len(want)-1]; last != dep {
			t.Fatalf("off: %v: the deletes come after the Deployment's apply", c.events)
		}
	}
}

// TestCheckExtraArgs: with egress on, an extra runner argument that sets one of the flags
// egress sets is refused naming it (the runner would take the later one); off, or any
// other argument, is fine.
func TestCheckExtraArgs(t *testing.T) {
	for _, c := range []struct {
		egress bool
		args   []string
		err    string
	}{
		{false, []string{"--egress-proxy-listen=:1", "--egress-dns-addr=192.0.2.1"}, ""},
		{true, nil, ""},
		{true, []string{"--egress-forbid=100.64.0.0/10", "--heartbeat-interval=1s", "egress-proxy-listen"}, ""},
		{true, []string{"--egress-proxy-listen=:1"}, `"--egress-proxy-listen=:1": --egress-proxy-listen is set`},
		{true, []string{"-egress-dns-listen", ":1"}, "--egress-dns-listen is set"},
		{true, []string{"--egress-proxy-addr="}, "--egress-proxy-addr is set"},
		{true, []string{"--x", "--egress-dns-addr=1.2.3.4"}, "--egress-dns-addr is set"},
	} {
		err := install.CheckExtraArgs(c.egress, c.args)
		if (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%v %q: %v, want %q", c.egress, c.args, err, c.err)
		}
	}
}
