// Package install builds the Kubernetes objects of a runner the control plane installs into
// a registered cluster, applies them with server-side apply, and removes them again. The
// objects are the Helm chart deploy/helm/sandboxd-runner's (namespace.create=true, the
// release named ReleaseName), built as typed objects here rather than by rendering the
// chart: helm's Go module would pull other k8s.io versions than the ones sandboxd builds
// with. test/k8s renders the chart with helm and checks that the fields that matter
// (image, args, env, RBAC rules, security contexts, volumes; with Values.Egress the egress
// Service, NetworkPolicy, args, ports and DNS settings: TestChartEgressCopiesAgree) agree
// with Objects.
//
// It is control-plane code that runners never import: the runner's own Kubernetes code
// (runtime/kubernetes) knows nothing of installs.
package install

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// Names and labels of what the control plane installs.
const (
	// ChartName is the chart's name: the app.kubernetes.io/name label.
	ChartName = "sandboxd-runner"
	// ReleaseName plays the Helm release's part; as it contains the chart's name, it is
	// also every object's name (the chart's fullname).
	ReleaseName = "sandboxd-runner"
	// FieldManager owns the fields the control plane applies.
	FieldManager = "sandboxd-controlplane"
	// ManagedBy is the app.kubernetes.io/managed-by label (Helm's is "Helm").
	ManagedBy = "sandboxd-controlplane"
	// ManagedByLabel carries ManagedBy on every installed object.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// RunnerLabel names the runner an object was installed for.
	RunnerLabel = "sandboxd.io/runner-id"
	// OrgLabel carries OrgHash of the organization an object was installed for: an
	// organization id has no syntax of its own (any string), a label value has (63
	// characters of [A-Za-z0-9._-]), so the label holds a hash and OrgAnnotation the id.
	OrgLabel = "sandboxd.io/org-hash"
	// OrgAnnotation is the organization id, for people reading the cluster.
	OrgAnnotation = "sandboxd.io/organization"
	// ChartVersion is the chart version the objects follow (Chart.yaml).
	ChartVersion = "0.1.0"
)

// Values are the chart values an install sets.
type Values struct {
	// Org and RunnerID name the runner; both go into every object's labels (OrgLabel,
	// RunnerLabel), which is how the control plane recognizes what it installed.
	Org       string
	RunnerID  string
	Namespace string
	// Image and AgentImage are full references (repository:tag or @digest).
	Image                  string
	AgentImage             string
	PullPolicy             corev1.PullPolicy // the runner image's; default IfNotPresent
	SandboxImagePullPolicy corev1.PullPolicy // default IfNotPresent
	// ControlPlane is HOST:PORT of the control plane's registration service as the cluster
	// reaches it; BootstrapToken the runner's one-time token; CAPEM the platform CA.
	ControlPlane   string
	BootstrapToken string
	CAPEM          string
	// BaseDomain of the runner's edge; "" the runner's default.
	BaseDomain string
	// StorageClass of the data volume; "" the cluster's default. PersistenceSize default 1Gi.
	StorageClass    string
	PersistenceSize string
	// ExtraArgs are appended to the runner's arguments (the chart's extraArgs).
	ExtraArgs []string
	// Version is the app.kubernetes.io/version label (the chart's appVersion).
	Version string
	// PrepullImages is the chart's prepull.images: at most this many template images the
	// runner pre-pulls onto the nodes; nil the chart's default (DefaultPrepullImages); 0 no
	// pre-pull, and then no ClusterRole (the runner needs `list` on nodes only for it).
	PrepullImages *int
	// PrepullInFlight is the chart's prepull.inFlight; 0 its default (DefaultPrepullInFlight).
	PrepullInFlight int
	// RuntimeClasses is the chart's runtimeClasses: sandbox runtime class -> Kubernetes
	// RuntimeClass name ("" the cluster's default runtime), the runner's --runtime-classes
	// (RuntimeClassesArg); empty: the flag is not passed (runc only). CheckRuntimeClasses
	// validates it.
	RuntimeClasses map[string]string
	// Egress is the chart's egress.enabled (its other egress values at their defaults):
	// the runner serves its egress proxy and DNS (host-name egress rules, egress secrets)
	// behind the Service EgressName, with the NetworkPolicy EgressName on its Pods
	// (egress.go). Off, Apply deletes both (an install with it on may have left them).
	// CheckExtraArgs refuses ExtraArgs that would override its flags.
	Egress bool
}

// RuntimeClassesFlag is the runner flag RuntimeClassesArg writes.
const RuntimeClassesFlag = "--runtime-classes"

// MaxRuntimeClasses bounds the runtime classes one runner offers (the chart's
// runtimeClasses, the runner's --runtime-classes): it reports them with its capacity.
const MaxRuntimeClasses = 16

// CheckRuntimeClasses validates a runtimeClasses value as the runner's --runtime-classes
// takes it (nil or empty: none, valid): at most MaxRuntimeClasses, runc among the classes
// (the runner's default class), each class a DNS label, each RuntimeClass name "" or a
// DNS subdomain. The errors name the offending class.
func CheckRuntimeClasses(m map[string]string) error {
	if len(m) == 0 {
		return nil
	}
	if len(m) > MaxRuntimeClasses {
		return fmt.Errorf("runtime classes: %d classes, want at most %d", len(m), MaxRuntimeClasses)
	}
	if _, ok := m["runc"]; !ok {
		return errors.New("runtime classes: no entry for runc, the runner's default class (runc= for the cluster's default runtime)")
	}
	for _, class := range slices.Sorted(maps.Keys(m)) {
		if errs := validation.IsDNS1123Label(class); len(errs) > 0 {
			return fmt.Errorf("runtime class %q: want a DNS label: %s", class, strings.Join(errs, "; "))
		}
		if name := m[class]; name != "" {
			if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
				return fmt.Errorf("runtime class %q: RuntimeClass name %q: want a DNS subdomain or empty: %s", class, name, strings.Join(errs, "; "))
			}
		}
	}
	return nil
}

// ParseRuntimeClasses reads a comma-separated class=RuntimeClass list (the runner's
// --runtime-classes syntax, e.g. "runc=,gvisor=gvisor"; "" none) and validates it
// (CheckRuntimeClasses): each class once.
func ParseRuntimeClasses(list string) (map[string]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for pair := range strings.SplitSeq(list, ",") {
		class, name, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || class == "" {
			return nil, fmt.Errorf("runtime classes: %q: want class=RuntimeClass (an empty RuntimeClass for the cluster's default runtime)", pair)
		}
		if _, dup := m[class]; dup {
			return nil, fmt.Errorf("runtime classes: class %q given twice", class)
		}
		if len(m) == MaxRuntimeClasses {
			return nil, fmt.Errorf("runtime classes: more than %d classes", MaxRuntimeClasses)
		}
		m[class] = name
	}
	return m, CheckRuntimeClasses(m)
}

// RuntimeClassesArg is the runner argument for m, as the chart renders it: "" for an empty
// m (no argument), else --runtime-classes=class=RuntimeClass,… with runc first and the
// other classes in name order.
func RuntimeClassesArg(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	var pairs []string
	if name, ok := m["runc"]; ok {
		pairs = append(pairs, "runc="+name)
	}
	for _, class := range slices.Sorted(maps.Keys(m)) {
		if class != "runc" {
			pairs = append(pairs, class+"="+m[class])
		}
	}
	return RuntimeClassesFlag + "=" + strings.Join(pairs, ",")
}

// The chart's prepull defaults (values.yaml).
const (
	DefaultPrepullImages   = 64
	DefaultPrepullInFlight = 4
)

func (v Values) prepullImages() int {
	if v.PrepullImages == nil {
		return DefaultPrepullImages
	}
	return max(*v.PrepullImages, 0)
}

// NodesRoleName is the name of the ClusterRole (and ClusterRoleBinding) that lets the
// runner installed into namespace ns list the cluster's nodes (image pre-pull): the chart's
// "<fullname>-<release namespace>-nodes". Cluster-scoped objects share one name space per
// cluster; ns (Namespace) is distinct per organization and runner, so this name is too.
func NodesRoleName(ns string) string {
	return ReleaseName + "-" + ns + "-nodes"
}

// Namespace is the namespace org's runner runnerID is installed into:
// sandboxd-<runner_id>-<8 hex of sha256(org "/" runner_id)>. The organization is in the
// hash because runner ids are unique only within an organization: without it two
// organizations' runners of one id would share a namespace on a shared cluster, and one
// would apply over (and delete) the other. A runner id too long for a DNS label (63) is
// cut; the hash keeps the name unique.
func Namespace(org, runnerID string) string {
	h := sha256.Sum256([]byte(org + "/" + runnerID))
	id := runnerID
	if room := 63 - len("sandboxd-") - 1 - 8; len(id) > room {
		id = strings.TrimRight(id[:room], "-")
	}
	return "sandboxd-" + id + "-" + hex.EncodeToString(h[:])[:8]
}

// OrgHash is OrgLabel's value for org: 32 hex digits of sha256(org), a valid label value
// whatever the organization id is.
func OrgHash(org string) string {
	h := sha256.Sum256([]byte(org))
	return hex.EncodeToString(h[:])[:32]
}

// Owned says whether labels (a namespace's) are exactly those the control plane gives
// org's runner runnerID: it applies into, and deletes, only such a namespace.
func Owned(labels map[string]string, org, runnerID string) bool {
	return labels[ManagedByLabel] == ManagedBy && labels[RunnerLabel] == runnerID && labels[OrgLabel] == OrgHash(org)
}

func labels(v Values) map[string]string {
	ver := v.Version
	if ver == "" {
		ver = "dev"
	}
	return map[string]string{
		"app.kubernetes.io/name":     ChartName,
		"app.kubernetes.io/instance": ReleaseName,
		"app.kubernetes.io/version":  ver,
		ManagedByLabel:               ManagedBy,
		"helm.sh/chart":              ChartName + "-" + ChartVersion,
		RunnerLabel:                  v.RunnerID,
		OrgLabel:                     OrgHash(v.Org),
	}
}

// HelloPort is the runner's UDP port for its sandboxes' gate hellos (the chart's
// hello.port): --hello-listen, --hello-addr, the container's port "hello".
const HelloPort = 7444

func selectorLabels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": ChartName, "app.kubernetes.io/instance": ReleaseName}
}

func meta(v Values, name string, namespaced bool) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: name, Labels: labels(v), Annotations: map[string]string{OrgAnnotation: v.Org}}
	if namespaced {
		m.Namespace = v.Namespace
	}
	return m
}

// Args are the runner container's arguments, as the chart's deployment.yaml writes them.
func Args(v Values) []string {
	args := []string{
		"runner",
		"--backend=kubernetes",
		"--namespace=" + v.Namespace,
		"--agent-image=" + v.AgentImage,
		"--image-pull-policy=" + string(orDefault(v.SandboxImagePullPolicy)),
		// Metrics and the /livez and /readyz probes on the Pod IP, as the runner chart
		// (metrics.port) has them.
		fmt.Sprintf("--metrics-listen=0.0.0.0:%d", metricsPort),
		fmt.Sprintf("--listen=0.0.0.0:%d", apiPort),
		"--data-dir=/var/lib/sandboxd",
		"--control-plane=$(SANDBOXD_CONTROL_PLANE)",
		"--bootstrap-token=$(SANDBOXD_BOOTSTRAP_TOKEN)",
	}
	if v.CAPEM != "" {
		args = append(args, "--control-plane-ca=/etc/sandboxd/control-plane/ca.pem")
	}
	args = append(args,
		"--runner-peer-pods=app.kubernetes.io/name="+ChartName+",app.kubernetes.io/instance="+ReleaseName,
		// The gates' hellos (the chart's hello.enabled, its default), UDP to the Pod's IP.
		"--hello-listen=:"+strconv.Itoa(HelloPort),
		"--hello-addr=[$(POD_IP)]:"+strconv.Itoa(HelloPort),
	)
	if v.Egress {
		// The chart's egress.enabled: the proxy and DNS, reached at the egress Service.
		args = append(args, egressArgs()...)
	}
	args = append(args,
		"--self-deployment="+ReleaseName,
		"--leader-elect",
		"--leader-elect-lease="+ReleaseName,
		"--leader-elect-lease-duration=15s",
		fmt.Sprintf("--edge-listen=0.0.0.0:%d", edgePort),
		"--edge-public-port=443",
	)
	if v.BaseDomain != "" {
		args = append(args, "--base-domain="+v.BaseDomain)
	}
	// Image pre-pull needs `list` on nodes: Objects adds the ClusterRole while it is on.
	inFlight := v.PrepullInFlight
	if inFlight <= 0 {
		inFlight = DefaultPrepullInFlight
	}
	args = append(args, fmt.Sprintf("--prepull-images=%d", v.prepullImages()), fmt.Sprintf("--prepull-in-flight=%d", inFlight))
	if a := RuntimeClassesArg(v.RuntimeClasses); a != "" {
		args = append(args, a)
	}
	return append(args, v.ExtraArgs...)
}

func orDefault(p corev1.PullPolicy) corev1.PullPolicy {
	if p == "" {
		return corev1.PullIfNotPresent
	}
	return p
}

// Objects are the runner's objects in apply order: the namespace first, then (while
// pre-pull is on) the cluster-scoped ClusterRole and ClusterRoleBinding that let the runner
// list nodes (NodesRoleName), (with Egress) the egress Service and NetworkPolicy before the
// Deployment, which comes last: its container reads the egress Service's address from the
// variables the kubelet sets for the Services that exist when it starts.
func Objects(v Values) []runtime.Object {
	name := ReleaseName
	secretData := map[string]string{"address": v.ControlPlane, "bootstrap-token": v.BootstrapToken}
	if v.CAPEM != "" {
		secretData["ca.pem"] = v.CAPEM
	}
	size := v.PersistenceSize
	if size == "" {
		size = "1Gi"
	}
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: meta(v, name, true),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if v.StorageClass != "" {
		pvc.Spec.StorageClassName = ptr.To(v.StorageClass)
	}
	events := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}
	sa := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: v.Namespace}}
	secretEnv := func(env, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}}
	}
	fieldEnv := func(env, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/sandboxd"}, {Name: "tmp", MountPath: "/tmp"}}
	volumes := []corev1.Volume{
		{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if v.CAPEM != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: "control-plane", MountPath: "/etc/sandboxd/control-plane", ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "control-plane", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: name, Items: []corev1.KeyToPath{{Key: "ca.pem", Path: "ca.pem"}}}}})
	}
	deploy := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta(v, name, true),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels()},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: selectorLabels()},
				Spec: corev1.PodSpec{
					ServiceAccountName: name,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
						FSGroup: ptr.To[int64](65532), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "runner",
						Image:           v.Image,
						ImagePullPolicy: orDefault(v.PullPolicy),
						Args:            Args(v),
						Env: []corev1.EnvVar{
							fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace"), fieldEnv("POD_IP", "status.podIP"),
							secretEnv("SANDBOXD_CONTROL_PLANE", "address"), secretEnv("SANDBOXD_BOOTSTRAP_TOKEN", "bootstrap-token"),
						},
						Ports: containerPorts(v),
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("api")}},
							PeriodSeconds: 2,
						},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
						},
						VolumeMounts: mounts,
					}},
					Volumes: volumes,
				},
			},
		},
	}
	if v.Egress {
		// The chart sets it with egress on (no pinned clusterIP): the egress Service's
		// ClusterIP reaches the runner as <SERVICE>_SERVICE_HOST.
		deploy.Spec.Template.Spec.EnableServiceLinks = ptr.To(true)
	}
	objs := []runtime.Object{
		&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: meta(v, v.Namespace, false)},
	}
	if v.prepullImages() > 0 {
		// The chart's rbac.yaml with prepull.images > 0: read-only, nodes only.
		nodes := NodesRoleName(v.Namespace)
		objs = append(objs,
			&rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"}, ObjectMeta: meta(v, nodes, false),
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}},
			&rbacv1.ClusterRoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"}, ObjectMeta: meta(v, nodes, false),
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: nodes}, Subjects: sa},
		)
	}
	objs = append(objs,
		&corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: meta(v, name, true)},
		&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: meta(v, name, true),
			Type: corev1.SecretTypeOpaque, StringData: secretData},
		pvc,
		&rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta(v, name+"-sandboxes", true),
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "create", "update", "delete", "patch"}},
				// The runner's egress roots ConfigMap (egress secrets): create (a create
				// names no object), get and update on that name only.
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{gate.EgressRootsConfigMapName(v.RunnerID)}, Verbs: []string{"get", "update"}},
				{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "create", "update", "patch", "delete"}},
				{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "create", "patch", "delete"}},
				// list: the kubelet's image pull events (the image pull metrics).
				{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "list"}},
			}},
		&rbacv1.RoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"}, ObjectMeta: meta(v, name+"-sandboxes", true),
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name + "-sandboxes"}, Subjects: sa},
		&rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta(v, name+"-self", true),
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{name}, Verbs: []string{"get", "update"}},
				{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{name}, Verbs: []string{"get", "patch"}},
				events,
			}},
		&rbacv1.RoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"}, ObjectMeta: meta(v, name+"-self", true),
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name + "-self"}, Subjects: sa},
		&corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: meta(v, name, true),
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: selectorLabels(), Ports: []corev1.ServicePort{
				{Name: "api", Port: 7443, TargetPort: intstr.FromString("api")},
				{Name: "edge", Port: 443, TargetPort: intstr.FromString("edge")},
			}}},
	)
	if v.Egress {
		objs = append(objs, egressObjects(v)...)
	}
	return append(objs, deploy)
}

// containerPorts are the runner container's ports, as the chart's (which also names the
// metrics port; the installer's probe is on the API port).
func containerPorts(v Values) []corev1.ContainerPort {
	ports := []corev1.ContainerPort{{Name: "api", ContainerPort: apiPort}, {Name: "edge", ContainerPort: edgePort},
		{Name: "hello", ContainerPort: HelloPort, Protocol: corev1.ProtocolUDP}}
	if v.Egress {
		ports = append(ports, egressPorts()...)
	}
	return ports
}

// clusterScoped lists the cluster-scoped kinds besides Namespace that Objects may make:
// they are created (never adopted) and deleted only when Owned, like the namespace.
var clusterScoped = []string{"ClusterRole", "ClusterRoleBinding"}

// Target is where objects are applied: a cluster (NewTarget), or a fake in tests that
// inject failures.
type Target interface {
	// Apply server-side applies obj (field manager FieldManager, forcing conflicts: the
	// control plane owns what it installs). Apply (the function) calls it only for objects
	// in a namespace it has checked is the runner's.
	Apply(ctx context.Context, obj runtime.Object) error
	// CreateNamespace creates ns (a plain create: one that exists is an error for which
	// apierrors.IsAlreadyExists holds), so that a namespace someone else made is never
	// adopted by a forced apply.
	CreateNamespace(ctx context.Context, ns *corev1.Namespace) error
	// GetNamespace returns the namespace's labels and UID; nil when there is none.
	GetNamespace(ctx context.Context, name string) (*NamespaceInfo, error)
	// DeleteNamespace deletes the namespace of that UID (with everything in it): the UID
	// precondition makes sure it is the one whose labels were checked. A missing one is no
	// error.
	DeleteNamespace(ctx context.Context, name string, uid types.UID) error
	// GetObject, CreateObject and DeleteObject do the same for the other cluster-scoped
	// kinds an install makes (ClusterRole, ClusterRoleBinding): a plain create, so that an
	// object someone else made is never adopted; a delete with the UID precondition.
	GetObject(ctx context.Context, kind, name string) (*NamespaceInfo, error)
	CreateObject(ctx context.Context, obj runtime.Object) error
	DeleteObject(ctx context.Context, kind, name string, uid types.UID) error
	// DeleteNamespaced deletes the object kind/name of namespace (one Apply has checked is
	// the runner's: what is in it is the runner's); a missing one is no error.
	DeleteNamespaced(ctx context.Context, kind, namespace, name string) error
}

// NamespaceInfo is what the control plane checks of an existing namespace.
type NamespaceInfo struct {
	Labels map[string]string
	UID    types.UID
}

// ForeignNamespaceError: the runner's namespace exists but does not carry the labels the
// control plane gives the runner (Owned), so it is someone else's: the control plane
// neither applies into it nor deletes it.
type ForeignNamespaceError struct {
	Namespace, Org, RunnerID string
	Labels                   map[string]string
	Delete                   bool // found when uninstalling
}

// ForeignPrefix starts every ForeignNamespaceError's text.
const ForeignPrefix = "foreign namespace: "

func (e *ForeignNamespaceError) Error() string {
	return fmt.Sprintf("%snamespace %s exists and was not created by this control plane for runner %s (labels %s=%q %s=%q %s=%q; want %s, %s, %s)",
		ForeignPrefix, e.Namespace, e.RunnerID, ManagedByLabel, e.Labels[ManagedByLabel], RunnerLabel, e.Labels[RunnerLabel],
		OrgLabel, e.Labels[OrgLabel], ManagedBy, e.RunnerID, OrgHash(e.Org))
}

// ForeignObjectError: a cluster-scoped object of the name the runner's ClusterRole or
// ClusterRoleBinding has (NodesRoleName) exists but does not carry the runner's labels
// (Owned), so it is someone else's: the control plane neither applies over it nor deletes it.
type ForeignObjectError struct {
	Kind, Name, Org, RunnerID string
	Labels                    map[string]string
	Delete                    bool // found when uninstalling
}

// ForeignObjectPrefix starts every ForeignObjectError's text.
const ForeignObjectPrefix = "foreign cluster-scoped object: "

func (e *ForeignObjectError) Error() string {
	return fmt.Sprintf("%s%s %s exists and was not created by this control plane for runner %s (labels %s=%q %s=%q %s=%q; want %s, %s, %s)",
		ForeignObjectPrefix, e.Kind, e.Name, e.RunnerID, ManagedByLabel, e.Labels[ManagedByLabel], RunnerLabel, e.Labels[RunnerLabel],
		OrgLabel, e.Labels[OrgLabel], ManagedBy, e.RunnerID, OrgHash(e.Org))
}

// Apply installs v's runner into t: it refuses (ForeignNamespaceError) if its namespace
// exists and is not the runner's (Owned), and (ForeignObjectError) if a cluster-scoped
// object of the runner's names (NodesRoleName) is not; both checks come before anything is
// created. It creates the namespace and the
// cluster-scoped objects that are missing, then applies every object. Objects are applied
// with force only inside the runner's own namespace and onto cluster-scoped objects it has
// checked are the runner's. With pre-pull off it deletes the runner's own ClusterRole and
// ClusterRoleBinding left from an install with it on (as `helm upgrade` would), and leaves
// foreign ones of those names alone. With Egress off it deletes the egress Service and
// NetworkPolicy from the runner's namespace after applying the rest (missing: fine), so
// that turning egress off cleans up; after, not before: a runner Pod that restarts before
// its Deployment drops the --egress-* args still finds the Service's variable.
func Apply(ctx context.Context, t Target, v Values) error {
	objs := Objects(v)
	ns := objs[0].(*corev1.Namespace)
	info, err := t.GetNamespace(ctx, v.Namespace)
	if err != nil {
		return err
	}
	if info != nil && !Owned(info.Labels, v.Org, v.RunnerID) {
		return &ForeignNamespaceError{Namespace: v.Namespace, Org: v.Org, RunnerID: v.RunnerID, Labels: info.Labels}
	}
	// The cluster-scoped objects are checked before anything is created: a foreign one
	// refuses the install with nothing of it in the cluster. With pre-pull off, a foreign
	// one is no conflict: it is left alone.
	nodes := NodesRoleName(v.Namespace)
	wanted := map[string]bool{}
	for _, obj := range objs[1:] {
		if kind := obj.GetObjectKind().GroupVersionKind().Kind; slices.Contains(clusterScoped, kind) {
			wanted[kind] = true
		}
	}
	existing := map[string]*NamespaceInfo{}
	for _, kind := range clusterScoped {
		oi, err := t.GetObject(ctx, kind, nodes)
		if err != nil {
			return err
		}
		if oi != nil && !Owned(oi.Labels, v.Org, v.RunnerID) {
			if wanted[kind] {
				return &ForeignObjectError{Kind: kind, Name: nodes, Org: v.Org, RunnerID: v.RunnerID, Labels: oi.Labels}
			}
			oi = nil // not the runner's: never deleted
		}
		existing[kind] = oi
	}
	if info == nil {
		cerr := t.CreateNamespace(ctx, ns)
		if cerr != nil && !apierrors.IsAlreadyExists(cerr) {
			return cerr
		}
		if cerr != nil { // made meanwhile: by whom?
			if info, err = t.GetNamespace(ctx, v.Namespace); err != nil {
				return err
			}
			if info == nil {
				return cerr
			}
		}
	}
	if info != nil && !Owned(info.Labels, v.Org, v.RunnerID) {
		return &ForeignNamespaceError{Namespace: v.Namespace, Org: v.Org, RunnerID: v.RunnerID, Labels: info.Labels}
	}
	for _, obj := range objs[1:] {
		u, err := Unstructured(obj)
		if err != nil {
			return err
		}
		if !slices.Contains(clusterScoped, u.GetKind()) {
			continue
		}
		if existing[u.GetKind()] != nil {
			continue
		}
		cerr := t.CreateObject(ctx, obj)
		if cerr == nil {
			continue
		}
		if !apierrors.IsAlreadyExists(cerr) {
			return cerr
		}
		got, err := t.GetObject(ctx, u.GetKind(), u.GetName()) // made meanwhile: by whom?
		if err != nil {
			return err
		}
		if got == nil {
			return cerr
		}
		if !Owned(got.Labels, v.Org, v.RunnerID) {
			return &ForeignObjectError{Kind: u.GetKind(), Name: u.GetName(), Org: v.Org, RunnerID: v.RunnerID, Labels: got.Labels}
		}
	}
	for _, kind := range clusterScoped {
		if info := existing[kind]; info != nil && !wanted[kind] { // the runner's own (checked above)
			if err := t.DeleteObject(ctx, kind, nodes, info.UID); err != nil {
				return err
			}
		}
	}
	for _, obj := range objs {
		if err := t.Apply(ctx, obj); err != nil {
			return err
		}
	}
	if !v.Egress {
		for _, kind := range EgressKinds {
			if err := t.DeleteNamespaced(ctx, kind, v.Namespace, EgressName); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remove deletes org's runner runnerID's namespace ns, with everything in it, and its
// ClusterRoleBinding and ClusterRole (NodesRoleName(ns)), each only if it is the runner's
// (Owned). A namespace that is not is left alone, and so is everything else
// (ForeignNamespaceError with Delete); a cluster-scoped object that is not is left alone
// after the runner's own objects are deleted (ForeignObjectError with Delete). Missing
// objects are no error.
func Remove(ctx context.Context, t Target, org, runnerID, ns string) error {
	info, err := t.GetNamespace(ctx, ns)
	if err != nil {
		return err
	}
	if info != nil && !Owned(info.Labels, org, runnerID) {
		return &ForeignNamespaceError{Namespace: ns, Org: org, RunnerID: runnerID, Labels: info.Labels, Delete: true}
	}
	if info != nil {
		if err := t.DeleteNamespace(ctx, ns, info.UID); err != nil {
			return err
		}
	}
	var foreign error
	name := NodesRoleName(ns)
	for _, kind := range []string{"ClusterRoleBinding", "ClusterRole"} {
		info, err := t.GetObject(ctx, kind, name)
		switch {
		case err != nil:
			return err
		case info == nil:
		case !Owned(info.Labels, org, runnerID):
			if foreign == nil {
				foreign = &ForeignObjectError{Kind: kind, Name: name, Org: org, RunnerID: runnerID, Labels: info.Labels, Delete: true}
			}
		default:
			if err := t.DeleteObject(ctx, kind, name, info.UID); err != nil {
				return err
			}
		}
	}
	return foreign
}

// resources maps each kind Objects makes to its resource.
var resources = map[string]schema.GroupVersionResource{
	"Namespace":             {Version: "v1", Resource: "namespaces"},
	"ServiceAccount":        {Version: "v1", Resource: "serviceaccounts"},
	"Secret":                {Version: "v1", Resource: "secrets"},
	"PersistentVolumeClaim": {Version: "v1", Resource: "persistentvolumeclaims"},
	"Service":               {Version: "v1", Resource: "services"},
	"NetworkPolicy":         {Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
	"Role":                  {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	"RoleBinding":           {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	"ClusterRole":           {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	"ClusterRoleBinding":    {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	"Deployment":            {Group: "apps", Version: "v1", Resource: "deployments"},
}

type cluster struct{ dyn dynamic.Interface }

// NewTarget returns the Target of the cluster rc reaches.
func NewTarget(rc *rest.Config) (Target, error) {
	d, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return cluster{dyn: d}, nil
}

// Unstructured converts a typed object.
func Unstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	// Typed objects carry "creationTimestamp": null and an empty status; neither is ours to apply.
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	return u, nil
}

func (c cluster) Apply(ctx context.Context, obj runtime.Object) error {
	u, err := Unstructured(obj)
	if err != nil {
		return err
	}
	gvr, ok := resources[u.GetKind()]
	if !ok {
		return fmt.Errorf("install: no resource for kind %s", u.GetKind())
	}
	body, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(gvr)
	if ns := u.GetNamespace(); ns != "" {
		ri = c.dyn.Resource(gvr).Namespace(ns)
	}
	_, err = ri.Patch(ctx, u.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: ptr.To(true)})
	if err != nil {
		return &ApplyError{Kind: u.GetKind(), Name: u.GetName(), Namespace: u.GetNamespace(), Err: err}
	}
	return nil
}

func (c cluster) CreateNamespace(ctx context.Context, ns *corev1.Namespace) error {
	u, err := Unstructured(ns)
	if err != nil {
		return err
	}
	if _, err := c.dyn.Resource(resources["Namespace"]).Create(ctx, u, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
		return &ApplyError{Kind: "Namespace", Name: ns.Name, Err: err}
	}
	return nil
}

func (c cluster) GetNamespace(ctx context.Context, name string) (*NamespaceInfo, error) {
	u, err := c.dyn.Resource(resources["Namespace"]).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		return &NamespaceInfo{Labels: u.GetLabels(), UID: u.GetUID()}, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	}
	return nil, &ApplyError{Kind: "Namespace", Name: name, Err: err, Get: true}
}

func (c cluster) DeleteNamespace(ctx context.Context, name string, uid types.UID) error {
	err := c.dyn.Resource(resources["Namespace"]).Delete(ctx, name, metav1.DeleteOptions{
		PropagationPolicy: ptr.To(metav1.DeletePropagationBackground), Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return &ApplyError{Kind: "Namespace", Name: name, Err: err, Delete: true}
	}
	return nil
}

func (c cluster) GetObject(ctx context.Context, kind, name string) (*NamespaceInfo, error) {
	gvr, ok := resources[kind]
	if !ok {
		return nil, fmt.Errorf("install: no resource for kind %s", kind)
	}
	u, err := c.dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		return &NamespaceInfo{Labels: u.GetLabels(), UID: u.GetUID()}, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	}
	return nil, &ApplyError{Kind: kind, Name: name, Err: err, Get: true}
}

func (c cluster) CreateObject(ctx context.Context, obj runtime.Object) error {
	u, err := Unstructured(obj)
	if err != nil {
		return err
	}
	gvr, ok := resources[u.GetKind()]
	if !ok {
		return fmt.Errorf("install: no resource for kind %s", u.GetKind())
	}
	if _, err := c.dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
		return &ApplyError{Kind: u.GetKind(), Name: u.GetName(), Err: err}
	}
	return nil
}

func (c cluster) DeleteNamespaced(ctx context.Context, kind, namespace, name string) error {
	gvr, ok := resources[kind]
	if !ok {
		return fmt.Errorf("install: no resource for kind %s", kind)
	}
	err := c.dyn.Resource(gvr).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return &ApplyError{Kind: kind, Name: name, Namespace: namespace, Err: err, Delete: true}
	}
	return nil
}

func (c cluster) DeleteObject(ctx context.Context, kind, name string, uid types.UID) error {
	gvr, ok := resources[kind]
	if !ok {
		return fmt.Errorf("install: no resource for kind %s", kind)
	}
	err := c.dyn.Resource(gvr).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return &ApplyError{Kind: kind, Name: name, Err: err, Delete: true}
	}
	return nil
}

// ApplyError is a failed apply (or delete) of one object.
type ApplyError struct {
	Kind, Name, Namespace string
	Delete, Get           bool
	Err                   error
}

func (e *ApplyError) Error() string {
	op := "apply"
	switch {
	case e.Delete:
		op = "delete"
	case e.Get:
		op = "get"
	}
	where := e.Name
	if e.Namespace != "" {
		where = e.Namespace + "/" + e.Name
	}
	return fmt.Sprintf("%s %s %s: %v", op, e.Kind, where, e.Err)
}

func (e *ApplyError) Unwrap() error { return e.Err }

// Diagnosis is what an install error means for an operator.
type Diagnosis struct {
	Reason string // apierr.Install*
	Hints  []string
}

// Diagnose classifies an install (or uninstall) error by the Kubernetes status behind it.
func Diagnose(err error) Diagnosis {
	if fe := (*ForeignNamespaceError)(nil); errors.As(err, &fe) {
		if fe.Delete {
			return Diagnosis{Reason: apierr.InstallConflict, Hints: []string{fmt.Sprintf(
				"namespace %s exists and was not created by this control plane for runner %s, so it was not deleted: if it is the runner's, delete it yourself; then delete the runner with force", fe.Namespace, fe.RunnerID)}}
		}
		return Diagnosis{Reason: apierr.InstallConflict, Hints: []string{fmt.Sprintf(
			"namespace %s exists and was not created by this control plane for this runner: remove it (after checking whose it is), or delete the runner and create it with another runner_id", fe.Namespace)}}
	}
	if fo := (*ForeignObjectError)(nil); errors.As(err, &fo) {
		if fo.Delete {
			return Diagnosis{Reason: apierr.InstallConflict, Hints: []string{fmt.Sprintf(
				"%s %s exists and was not created by this control plane for runner %s, so it was not deleted (the runner's own objects were): if it is the runner's, delete it yourself; then delete the runner with force", fo.Kind, fo.Name, fo.RunnerID)}}
		}
		return Diagnosis{Reason: apierr.InstallConflict, Hints: []string{fmt.Sprintf(
			"%s %s exists and was not created by this control plane for this runner, so the install stopped before applying anything over it: remove it (after checking whose it is), or delete the runner and create it with another runner_id", fo.Kind, fo.Name)}}
	}
	var ae *ApplyError
	kind, ns, op := "objects", "", "create"
	if errors.As(err, &ae) {
		kind, ns = ae.Kind, ae.Namespace
		if ae.Delete {
			op = "delete"
		}
		if ae.Get {
			op = "get"
		}
	}
	resource := strings.ToLower(kind) + "s"
	if gvr, ok := resources[kind]; ok {
		resource = gvr.Resource
	}
	switch {
	case apierrors.IsForbidden(err):
		scope := "in namespace " + ns
		if ns == "" {
			scope = "cluster-wide"
		}
		h := []string{
			fmt.Sprintf("the cluster credential lacks RBAC to %s %s (%s): grant its user a ClusterRole with get, create, patch and delete on %s (and on every kind the runner chart installs: namespaces, serviceaccounts, secrets, persistentvolumeclaims, services, networkpolicies, deployments, roles, rolebindings, clusterroles, clusterrolebindings), or register the cluster with a credential that has them",
				op, resource, scope, resource),
			"a Role may only grant what its creator holds: the credential also needs the runner's own rules (pods, secrets, configmaps, networkpolicies, persistentvolumeclaims, events, leases, deployments; and list on nodes, for the image pre-pull ClusterRole) to create its Roles and ClusterRole",
		}
		return Diagnosis{Reason: apierr.InstallForbidden, Hints: h}
	case apierrors.IsUnauthorized(err):
		return Diagnosis{Reason: apierr.InstallUnauthenticated, Hints: []string{
			"the API server does not accept the cluster credential (expired or revoked token, or a certificate of another CA): delete the cluster and add it again with a valid credential"}}
	case apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err):
		return Diagnosis{Reason: apierr.InstallConflict, Hints: []string{
			fmt.Sprintf("another manager owns %s %s: remove it, or pick another runner_id", kind, ns)}}
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return Diagnosis{Reason: apierr.InstallRejected, Hints: []string{
			"the API server rejected an object the control plane built: check the install flags (--install-runner-image, --install-storage-class, …)"}}
	case errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err):
		return Diagnosis{Reason: apierr.InstallTimeout, Hints: []string{
			"the API server did not answer in time: check that the control plane reaches the cluster's server URL"}}
	}
	return Diagnosis{Reason: apierr.InstallFailed, Hints: []string{
		"check that the control plane reaches the cluster's API server and that the server URL and CA are right"}}
}
