package k8s

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/sandboxd/sandboxd/internal/install"
)

// egressCopy is what the egress changes of one copy (the chart, the installer): the
// objects named like the egress Service, the runner's --egress-* args, its env, its
// egress container ports, enableServiceLinks and the Pod's DNS settings.
type egressCopy struct {
	Names              []string // Kind/name of the egress objects, sorted
	Service            *corev1.ServiceSpec
	NetworkPolicy      *networkingv1.NetworkPolicySpec
	Args               []string
	ArgsAfter          string // the argument before the first --egress-* (where they sit)
	Env                []string
	Ports              []corev1.ContainerPort
	EnableServiceLinks *bool
	DNSPolicy          corev1.DNSPolicy
	DNSConfig          *corev1.PodDNSConfig
}

func egressCopyOf(t *testing.T, objs []runtime.Object) egressCopy {
	t.Helper()
	var e egressCopy
	var d *appsv1.Deployment
	for _, o := range objs {
		switch x := o.(type) {
		case *appsv1.Deployment:
			d = x
		case *corev1.Service:
			if strings.HasSuffix(x.Name, "-egress") {
				e.Names = append(e.Names, "Service/"+x.Name)
				e.Service = &x.Spec
			}
		case *networkingv1.NetworkPolicy:
			e.Names = append(e.Names, "NetworkPolicy/"+x.Name)
			e.NetworkPolicy = &x.Spec
		}
	}
	if d == nil {
		t.Fatal("no Deployment")
	}
	slices.Sort(e.Names)
	c := d.Spec.Template.Spec.Containers[0]
	for i, a := range c.Args {
		if strings.HasPrefix(a, "--egress") {
			if e.Args == nil && i > 0 {
				e.ArgsAfter, _, _ = strings.Cut(c.Args[i-1], "=")
			}
			e.Args = append(e.Args, a)
		}
	}
	e.Env = envShape(c.Env)
	for _, p := range c.Ports {
		if strings.HasPrefix(p.Name, "egress") {
			e.Ports = append(e.Ports, p)
		}
	}
	ps := d.Spec.Template.Spec
	e.EnableServiceLinks, e.DNSPolicy, e.DNSConfig = ps.EnableServiceLinks, ps.DNSPolicy, ps.DNSConfig
	return e
}

// chartObjects decodes the rendered chart's Deployments, Services and NetworkPolicies.
func chartObjects(t *testing.T, r renderedChart) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, k := range r.keys() {
		var o runtime.Object
		switch kind, _, _ := strings.Cut(k, "/"); kind {
		case "Deployment":
			o = new(appsv1.Deployment)
		case "Service":
			o = new(corev1.Service)
		case "NetworkPolicy":
			o = new(networkingv1.NetworkPolicy)
		default:
			continue
		}
		r.get(t, k, o)
		out = append(out, o)
	}
	return out
}

// TestChartEgressCopiesAgree (issue 23) is the one home of the egress's two copies: the
// chart's egress.enabled=true (its other values at their defaults, as the installer
// renders its runner: release sandboxd-runner, namespace.create) and the installer's
// Values.Egress (--install-egress) render the same egress Service (name, type, clusterIP,
// selector, ports) and NetworkPolicy (name, spec), the same --egress-* args at the same
// place, the same env, egress container ports, enableServiceLinks and dnsPolicy/dnsConfig;
// with egress off, neither renders any of it. One side changed alone fails it. The chart
// alone is TestChartEgress's; the installer on a cluster, TestInstalledRunner's.
func TestChartEgressCopiesAgree(t *testing.T) {
	helm := chartHelm(t)
	const ns = "sandboxd" // renderChart's release namespace: the runner's namespace and its sandboxes'
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("egress %v", on), func(t *testing.T) {
			r, err := renderChart(t, helm, install.ReleaseName, "--set", fmt.Sprintf("namespace.create=true,egress.enabled=%v", on))
			if err != nil {
				t.Fatal(err)
			}
			chart := egressCopyOf(t, chartObjects(t, r))
			installer := egressCopyOf(t, install.Objects(install.Values{Org: "o", RunnerID: "r1", Namespace: ns, Image: "i", AgentImage: "a", Egress: on}))
			if on && (chart.Service == nil || chart.NetworkPolicy == nil || chart.Args == nil) {
				t.Fatalf("the chart renders no egress: %v args %q", chart.Names, chart.Args)
			}
			if !on && (chart.Names != nil || chart.Args != nil || chart.Ports != nil) {
				t.Fatalf("egress off: the chart renders %v args %q ports %v", chart.Names, chart.Args, chart.Ports)
			}
			cv, iv := reflect.ValueOf(chart), reflect.ValueOf(installer)
			for i := range cv.NumField() {
				if c, in := cv.Field(i).Interface(), iv.Field(i).Interface(); !reflect.DeepEqual(c, in) {
					t.Errorf("%s: the chart's %s, the installer's %s", cv.Type().Field(i).Name, show(c), show(in))
				}
			}
		})
	}
}

func show(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer && !rv.IsNil() {
		return fmt.Sprintf("%+v", rv.Elem().Interface())
	}
	return fmt.Sprintf("%+v", v)
}
