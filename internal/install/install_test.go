package install_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/install"
)

func TestNamespace(t *testing.T) {
	if got := install.Namespace("r1"); got != "sandboxd-r1" {
		t.Fatalf("short: %s", got)
	}
	long := "r" + strings.Repeat("a", 62)
	got := install.Namespace(long)
	if len(got) > 63 || !strings.HasPrefix(got, "sandboxd-r") || got == install.Namespace(long[:62]+"b") {
		t.Fatalf("long: %s", got)
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
		if u.GetKind() != "Namespace" && u.GetNamespace() != "sandboxd-r1" {
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
