package install_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/install"
)

// memCluster is an API server in memory as install.Target sees it: cluster-scoped objects
// (Namespace, ClusterRole, ClusterRoleBinding) by Kind/name with their labels and the
// object itself, and the namespaced objects applied. raceCreate makes the next CreateObject
// of that Kind/name find an object of those labels (made meanwhile by someone else).
type memCluster struct {
	mu         sync.Mutex
	objs       map[string]runtime.Object // Kind/name of cluster-scoped objects
	labels     map[string]map[string]string
	applied    []string // Kind/[namespace/]name, in order
	created    []string
	deleted    []string
	nsDeleted  []string // Kind/namespace/name of DeleteNamespaced, in order
	events     []string // "apply Kind/…" and "delete Kind/namespace/name", in order
	raceCreate map[string]map[string]string
}

func newMemCluster() *memCluster {
	return &memCluster{objs: map[string]runtime.Object{}, labels: map[string]map[string]string{}}
}

func key(obj runtime.Object) (string, metav1Object) {
	m, _ := meta.Accessor(obj)
	return obj.GetObjectKind().GroupVersionKind().Kind + "/" + m.GetName(), m
}

type metav1Object interface {
	GetName() string
	GetNamespace() string
	GetLabels() map[string]string
}

func (c *memCluster) Apply(_ context.Context, obj runtime.Object) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, m := key(obj)
	if m.GetNamespace() == "" {
		if _, ok := c.labels[k]; !ok {
			return errors.New("test: forced apply of a cluster-scoped object that was not created first: " + k)
		}
		c.objs[k], c.labels[k] = obj, maps.Clone(m.GetLabels())
		c.applied = append(c.applied, k)
		return nil
	}
	kind, _, _ := strings.Cut(k, "/")
	c.applied = append(c.applied, kind+"/"+m.GetNamespace()+"/"+m.GetName())
	c.events = append(c.events, "apply "+kind+"/"+m.GetNamespace()+"/"+m.GetName())
	return nil
}

func (c *memCluster) create(obj runtime.Object) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, m := key(obj)
	if l, ok := c.raceCreate[k]; ok {
		delete(c.raceCreate, k)
		c.labels[k] = l
	}
	if _, ok := c.labels[k]; ok {
		return apierrors.NewAlreadyExists(schema.GroupResource{Resource: strings.ToLower(obj.GetObjectKind().GroupVersionKind().Kind) + "s"}, m.GetName())
	}
	c.objs[k], c.labels[k] = obj, maps.Clone(m.GetLabels())
	c.created = append(c.created, k)
	return nil
}

func (c *memCluster) get(k string) *install.NamespaceInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.labels[k]
	if !ok {
		return nil
	}
	return &install.NamespaceInfo{Labels: maps.Clone(l), UID: types.UID("uid-" + k)}
}

func (c *memCluster) remove(k string, uid types.UID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.labels[k]; !ok {
		return nil
	}
	if uid != types.UID("uid-"+k) {
		return apierrors.NewConflict(schema.GroupResource{}, k, errors.New("uid precondition"))
	}
	delete(c.labels, k)
	delete(c.objs, k)
	c.deleted = append(c.deleted, k)
	return nil
}

func (c *memCluster) CreateNamespace(_ context.Context, ns *corev1.Namespace) error {
	return c.create(ns)
}
func (c *memCluster) GetNamespace(_ context.Context, name string) (*install.NamespaceInfo, error) {
	return c.get("Namespace/" + name), nil
}
func (c *memCluster) DeleteNamespace(_ context.Context, name string, uid types.UID) error {
	return c.remove("Namespace/"+name, uid)
}
func (c *memCluster) CreateObject(_ context.Context, obj runtime.Object) error { return c.create(obj) }
func (c *memCluster) GetObject(_ context.Context, kind, name string) (*install.NamespaceInfo, error) {
	return c.get(kind + "/" + name), nil
}
func (c *memCluster) DeleteObject(_ context.Context, kind, name string, uid types.UID) error {
	return c.remove(kind+"/"+name, uid)
}

func (c *memCluster) DeleteNamespaced(_ context.Context, kind, namespace, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nsDeleted = append(c.nsDeleted, kind+"/"+namespace+"/"+name)
	c.events = append(c.events, "delete "+kind+"/"+namespace+"/"+name)
	return nil
}

func (c *memCluster) has(k string) bool { return c.get(k) != nil }

func values(org, runnerID string) install.Values {
	return install.Values{Org: org, RunnerID: runnerID, Namespace: install.Namespace(org, runnerID), Image: "img:1", AgentImage: "agent:1",
		ControlPlane: "cp:8443", BootstrapToken: "tok"}
}

func deploymentArgs(t *testing.T, objs []runtime.Object) []string {
	t.Helper()
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			return d.Spec.Template.Spec.Containers[0].Args
		}
	}
	t.Fatal("no Deployment")
	return nil
}

// TestObjectsPrepullRBAC: by default (the chart's prepull.images 64) the install pre-pulls
// and carries a ClusterRole with only `list` on nodes, bound to the runner's ServiceAccount,
// both named per runner and labelled like the other objects; prepull off: neither, and
// --prepull-images=0.
func TestObjectsPrepullRBAC(t *testing.T) {
	v := values("org-a", "r1")
	objs := install.Objects(v)
	args := deploymentArgs(t, objs)
	if !slices.Contains(args, "--prepull-images=64") || !slices.Contains(args, "--prepull-in-flight=4") {
		t.Fatalf("default args %v", args)
	}
	name := install.NodesRoleName(v.Namespace)
	if name != "sandboxd-runner-"+v.Namespace+"-nodes" { // the chart's "<fullname>-<release namespace>-nodes"
		t.Fatalf("name %s", name)
	}
	var cr *rbacv1.ClusterRole
	var crb *rbacv1.ClusterRoleBinding
	for i, o := range objs {
		switch x := o.(type) {
		case *rbacv1.ClusterRole:
			cr = x
			if i != 1 {
				t.Errorf("ClusterRole at %d, want right after the namespace", i)
			}
		case *rbacv1.ClusterRoleBinding:
			crb = x
			if i != 2 {
				t.Errorf("ClusterRoleBinding at %d", i)
			}
		}
	}
	if cr == nil || crb == nil {
		t.Fatal("no ClusterRole/ClusterRoleBinding")
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}
	if cr.Name != name || cr.Namespace != "" || !slicesEqualRules(cr.Rules, want) {
		t.Fatalf("ClusterRole %s %+v", cr.Name, cr.Rules)
	}
	if crb.Name != name || crb.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name}) ||
		len(crb.Subjects) != 1 || crb.Subjects[0] != (rbacv1.Subject{Kind: "ServiceAccount", Name: install.ReleaseName, Namespace: v.Namespace}) {
		t.Fatalf("ClusterRoleBinding %+v %+v", crb.RoleRef, crb.Subjects)
	}
	for _, m := range []metav1Object{cr, crb} {
		if !install.Owned(m.GetLabels(), "org-a", "r1") {
			t.Fatalf("%s labels %v", m.GetName(), m.GetLabels())
		}
	}

	v.PrepullImages, v.PrepullInFlight = ptr.To(16), 2
	args = deploymentArgs(t, install.Objects(v))
	if !slices.Contains(args, "--prepull-images=16") || !slices.Contains(args, "--prepull-in-flight=2") {
		t.Fatalf("args %v", args)
	}
	v.PrepullImages = ptr.To(0)
	objs = install.Objects(v)
	if !slices.Contains(deploymentArgs(t, objs), "--prepull-images=0") {
		t.Fatalf("off: %v", deploymentArgs(t, objs))
	}
	for _, o := range objs {
		switch o.(type) {
		case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			t.Fatalf("pre-pull off still makes %T", o)
		}
	}
}

func slicesEqualRules(a, b []rbacv1.PolicyRule) bool {
	return slices.EqualFunc(a, b, func(x, y rbacv1.PolicyRule) bool {
		return slices.Equal(x.APIGroups, y.APIGroups) && slices.Equal(x.Resources, y.Resources) && slices.Equal(x.Verbs, y.Verbs) &&
			len(x.ResourceNames) == 0 && len(y.ResourceNames) == 0 && len(x.NonResourceURLs) == 0 && len(y.NonResourceURLs) == 0
	})
}

// TestPrepullRBACNamesDistinct: two runners in one cluster (of one organization, or of two
// with one runner id) never share a ClusterRole or ClusterRoleBinding.
func TestPrepullRBACNamesDistinct(t *testing.T) {
	c := newMemCluster()
	ctx := context.Background()
	seen := map[string]bool{}
	for _, v := range []install.Values{values("org-a", "r1"), values("org-a", "r2"), values("org-b", "r1")} {
		if err := install.Apply(ctx, c, v); err != nil {
			t.Fatalf("%s/%s: %v", v.Org, v.RunnerID, err)
		}
		n := install.NodesRoleName(v.Namespace)
		if seen[n] {
			t.Fatalf("%s/%s shares %s", v.Org, v.RunnerID, n)
		}
		seen[n] = true
		for _, k := range []string{"ClusterRole/" + n, "ClusterRoleBinding/" + n} {
			if l := c.get(k); l == nil || !install.Owned(l.Labels, v.Org, v.RunnerID) {
				t.Fatalf("%s: %v", k, l)
			}
		}
	}
	if len(c.labels) != 9 {
		t.Fatalf("cluster-scoped objects %v", slices.Sorted(maps.Keys(c.labels)))
	}
}

// TestApplyRefusesForeignClusterRole: a ClusterRole or ClusterRoleBinding of the runner's
// name that is not the runner's (another runner's, another organization's, Helm's, no
// labels) refuses the install with an error naming it, before anything is created; it is
// left exactly as it was.
func TestApplyRefusesForeignClusterRole(t *testing.T) {
	v := values("org-a", "r1")
	name := install.NodesRoleName(v.Namespace)
	for _, kind := range []string{"ClusterRole", "ClusterRoleBinding"} {
		for what, l := range map[string]map[string]string{
			"another runner": {install.ManagedByLabel: install.ManagedBy, install.RunnerLabel: "r9", install.OrgLabel: install.OrgHash("org-a")},
			"another org":    {install.ManagedByLabel: install.ManagedBy, install.RunnerLabel: "r1", install.OrgLabel: install.OrgHash("org-b")},
			"helm":           {install.ManagedByLabel: "Helm", install.RunnerLabel: "r1", install.OrgLabel: install.OrgHash("org-a")},
			"no labels":      nil,
		} {
			t.Run(kind+"/"+what, func(t *testing.T) {
				c := newMemCluster()
				foreign := &rbacv1.ClusterRole{Rules: []rbacv1.PolicyRule{{Verbs: []string{"*"}}}}
				c.objs[kind+"/"+name], c.labels[kind+"/"+name] = foreign, maps.Clone(l)
				err := install.Apply(context.Background(), c, v)
				var fe *install.ForeignObjectError
				if !errors.As(err, &fe) || fe.Kind != kind || fe.Name != name || fe.Delete ||
					!strings.HasPrefix(err.Error(), install.ForeignObjectPrefix) || !strings.Contains(err.Error(), kind+" "+name) {
					t.Fatalf("err %v", err)
				}
				if d := install.Diagnose(err); d.Reason != apierr.InstallConflict || !strings.Contains(strings.Join(d.Hints, " "), name) {
					t.Fatalf("diagnosis %+v", d)
				}
				if len(c.created) != 0 || len(c.applied) != 0 || len(c.deleted) != 0 || c.objs[kind+"/"+name] != foreign ||
					!maps.Equal(c.labels[kind+"/"+name], l) {
					t.Fatalf("touched: created %v applied %v deleted %v", c.created, c.applied, c.deleted)
				}
			})
		}
	}
	// Made by someone else between the check and the create: refused too, not adopted.
	c := newMemCluster()
	c.raceCreate = map[string]map[string]string{"ClusterRoleBinding/" + name: {"x": "y"}}
	err := install.Apply(context.Background(), c, v)
	var fe *install.ForeignObjectError
	if !errors.As(err, &fe) || fe.Kind != "ClusterRoleBinding" {
		t.Fatalf("race: %v", err)
	}
	if slices.Contains(c.applied, "ClusterRoleBinding/"+name) || !maps.Equal(c.labels["ClusterRoleBinding/"+name], map[string]string{"x": "y"}) {
		t.Fatalf("race: applied over the foreign binding: %v", c.applied)
	}
}

// TestApplyUpgradeAndRemove: a second apply (an upgrade) applies over the runner's own
// ClusterRole and ClusterRoleBinding; an apply with pre-pull off deletes them; uninstall
// deletes the namespace and both, and leaves a foreign one (reporting it).
func TestApplyUpgradeAndRemove(t *testing.T) {
	ctx := context.Background()
	v := values("org-a", "r1")
	name := install.NodesRoleName(v.Namespace)
	c := newMemCluster()
	if err := install.Apply(ctx, c, v); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.created, []string{"ClusterRole/" + name, "ClusterRoleBinding/" + name, "Namespace/" + v.Namespace}) &&
		!slices.Equal(c.created, []string{"Namespace/" + v.Namespace, "ClusterRole/" + name, "ClusterRoleBinding/" + name}) {
		t.Fatalf("created %v", c.created)
	}
	v.Version = "2"
	c.applied = nil
	if err := install.Apply(ctx, c, v); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if !slices.Contains(c.applied, "ClusterRole/"+name) || !slices.Contains(c.applied, "ClusterRoleBinding/"+name) ||
		c.get("ClusterRole/" + name).Labels["app.kubernetes.io/version"] != "2" {
		t.Fatalf("upgrade applied %v", c.applied)
	}
	off := v
	off.PrepullImages = ptr.To(0)
	if err := install.Apply(ctx, c, off); err != nil {
		t.Fatal(err)
	}
	if c.has("ClusterRole/"+name) || c.has("ClusterRoleBinding/"+name) || !c.has("Namespace/"+v.Namespace) {
		t.Fatalf("pre-pull off left %v", slices.Sorted(maps.Keys(c.labels)))
	}
	if err := install.Apply(ctx, c, v); err != nil { // on again
		t.Fatal(err)
	}
	if err := install.Remove(ctx, c, "org-a", "r1", v.Namespace); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if len(c.labels) != 0 {
		t.Fatalf("left after uninstall: %v", slices.Sorted(maps.Keys(c.labels)))
	}
	if err := install.Remove(ctx, c, "org-a", "r1", v.Namespace); err != nil {
		t.Fatalf("remove again: %v", err)
	}

	// A foreign binding of the runner's name: the runner's own objects go, it stays.
	if err := install.Apply(ctx, c, v); err != nil {
		t.Fatal(err)
	}
	c.labels["ClusterRoleBinding/"+name] = map[string]string{install.ManagedByLabel: "Helm"}
	err := install.Remove(ctx, c, "org-a", "r1", v.Namespace)
	var fe *install.ForeignObjectError
	if !errors.As(err, &fe) || !fe.Delete || fe.Kind != "ClusterRoleBinding" || !strings.Contains(err.Error(), name) {
		t.Fatalf("remove with a foreign binding: %v", err)
	}
	if !c.has("ClusterRoleBinding/"+name) || c.has("ClusterRole/"+name) || c.has("Namespace/"+v.Namespace) {
		t.Fatalf("after: %v", slices.Sorted(maps.Keys(c.labels)))
	}
	if d := install.Diagnose(err); d.Reason != apierr.InstallConflict || !strings.Contains(d.Hints[0], "was not deleted") {
		t.Fatalf("diagnosis %+v", d)
	}
	// Pre-pull off: a foreign one is no conflict, and is never deleted.
	if err := install.Apply(ctx, c, off); err != nil {
		t.Fatalf("apply off with a foreign binding: %v", err)
	}
	if !c.has("ClusterRoleBinding/"+name) || c.labels["ClusterRoleBinding/"+name][install.ManagedByLabel] != "Helm" {
		t.Fatal("foreign binding deleted or changed")
	}
}
