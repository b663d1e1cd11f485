package install

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The runner's egress proxy and DNS (Values.Egress): what the chart renders with
// egress.enabled=true and its other egress values at their defaults (proxyPort 15443,
// dnsPort 5353, no clusterIP, no forbid, networkPolicy.enabled true; dnsPolicy and
// dnsConfig unset: the cluster's DNS). test/k8s TestChartEgressCopiesAgree renders the
// chart so and holds these objects to it.

// EgressName names the egress Service and NetworkPolicy: the chart's "<fullname>-egress".
const EgressName = ReleaseName + "-egress"

// The egress proxy's and DNS's ports on the runner Pod (the chart's egress.proxyPort and
// egress.dnsPort defaults); the egress Service maps 443 and 53 to them.
const (
	EgressProxyPort = 15443
	EgressDNSPort   = 5353
)

// The runner's other ports, which the egress NetworkPolicy leaves open to anyone (as the
// chart's: the API, the edge, metrics.port, hello.port).
const (
	apiPort     = 7443
	edgePort    = 8443
	metricsPort = 9467
)

// EgressAddr is where the runner tells its sandboxes the proxy and DNS are: the egress
// Service's ClusterIP, which the kubelet gives the runner's container as
// <SERVICE>_SERVICE_HOST (a Service of the Pod's namespace that exists when the container
// starts; $(VAR) in args expands it), as the chart's egressAddr without a pinned clusterIP.
var EgressAddr = "$(" + strings.ToUpper(strings.ReplaceAll(EgressName, "-", "_")) + "_SERVICE_HOST)"

// EgressFlags are the runner flags Values.Egress sets.
var EgressFlags = []string{"--egress-proxy-listen", "--egress-dns-listen", "--egress-proxy-addr", "--egress-dns-addr"}

// EgressKinds are the kinds of the egress objects (named EgressName in the runner's
// namespace): Apply deletes them while Values.Egress is off.
var EgressKinds = []string{"NetworkPolicy", "Service"}

// egressArgs are the runner's --egress-* arguments, as the chart's deployment.yaml writes them.
func egressArgs() []string {
	return []string{
		fmt.Sprintf("--egress-proxy-listen=:%d", EgressProxyPort),
		fmt.Sprintf("--egress-dns-listen=:%d", EgressDNSPort),
		"--egress-proxy-addr=" + EgressAddr,
		"--egress-dns-addr=" + EgressAddr,
	}
}

// CheckExtraArgs refuses extra runner arguments (Values.ExtraArgs) that set one of
// EgressFlags while egress is on: appended after them, the runner would take theirs and
// serve somewhere the egress Service and NetworkPolicy do not point. Off, they are the
// operator's own (--egress-forbid, which egress does not set, is always fine).
func CheckExtraArgs(egress bool, extra []string) error {
	if !egress {
		return nil
	}
	for _, a := range extra {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		for _, f := range EgressFlags {
			if "--"+name == f {
				return fmt.Errorf("runner argument %q: %s is set by the installer's egress (the egress Service and NetworkPolicy point at it)", a, f)
			}
		}
	}
	return nil
}

// egressPorts are the runner container's egress ports (after its others).
func egressPorts() []corev1.ContainerPort {
	return []corev1.ContainerPort{
		{Name: "egress-proxy", ContainerPort: EgressProxyPort},
		{Name: "egress-dns", ContainerPort: EgressDNSPort, Protocol: corev1.ProtocolUDP},
		{Name: "egress-dns-tcp", ContainerPort: EgressDNSPort},
	}
}

// egressObjects are the egress Service and NetworkPolicy, as the chart's egress.yaml
// renders them (the sandbox namespace is the runner's own).
func egressObjects(v Values) []runtime.Object {
	port := func(proto corev1.Protocol, p int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: new(intstr.FromInt32(p))}
	}
	return []runtime.Object{
		// Always ClusterIP: the proxy and DNS serve the runner's own sandboxes only.
		&corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: meta(v, EgressName, true),
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: selectorLabels(), Ports: []corev1.ServicePort{
				{Name: "proxy", Port: 443, TargetPort: intstr.FromString("egress-proxy"), Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: 53, TargetPort: intstr.FromString("egress-dns"), Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromString("egress-dns-tcp"), Protocol: corev1.ProtocolTCP},
			}}},
		// The proxy and DNS from the sandbox Pods of the runner's namespace only (the
		// backend's labels: managed-by sandboxd and a sandbox ID, which its pre-pull Pods
		// lack); the runner's other ports from anywhere, as without the policy.
		&networkingv1.NetworkPolicy{TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}, ObjectMeta: meta(v, EgressName, true),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: selectorLabels()},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{
					{
						From: []networkingv1.NetworkPolicyPeer{{
							NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: v.Namespace}},
							PodSelector: &metav1.LabelSelector{
								MatchLabels:      map[string]string{"app.kubernetes.io/managed-by": "sandboxd"},
								MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "sandboxd.io/sandbox-id", Operator: metav1.LabelSelectorOpExists}},
							},
						}},
						Ports: []networkingv1.NetworkPolicyPort{
							port(corev1.ProtocolTCP, EgressProxyPort), port(corev1.ProtocolUDP, EgressDNSPort), port(corev1.ProtocolTCP, EgressDNSPort)},
					},
					{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, apiPort), port(corev1.ProtocolTCP, edgePort),
						port(corev1.ProtocolTCP, metricsPort), port(corev1.ProtocolUDP, HelloPort)}},
				},
			}},
	}
}
