package kubernetes

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Registered volumes as PersistentVolumeClaims (runtime.ClaimVolumes, docs/volumes.md).
//
// A claim the backend makes carries LabelManagedBy=sandboxd, LabelKind=KindVolume,
// LabelVolumeOrg (the organization's hash) and LabelRegisteredVolume (the registered
// volume's managed name, by which a sandbox's Volume.Managed finds it); RemoveClaim
// deletes only such claims. A claim that exists already is adopted only when it grants
// the organization: LabelVolumeOrg = runtime.OrgHash(org), set by whoever made it (the
// cluster's admin). Without that any organization using the runner could mount any claim
// in the runner's namespace: another organization's, or the runner's own. Adopting adds
// LabelRegisteredVolume; letting go (RemoveClaim) takes it off again and leaves the claim.

const (
	// LabelVolumeOrg grants a claim to an organization (runtime.OrgHash of its ID).
	LabelVolumeOrg = "sandboxd.io/volume-org"
	// LabelRegisteredVolume names the registered volume (runtime.Claim.Managed) a claim holds.
	LabelRegisteredVolume = "sandboxd.io/registered-volume"
	// KindVolume is the LabelKind of claims the backend made.
	KindVolume = "volume"
	// AnnotationAccessMode on a StorageClass ("ReadWriteOnce" or "ReadWriteOncePod") makes
	// the claims the backend makes of that class use it instead of ReadWriteMany (a class
	// does not say which modes its provisioner offers).
	AnnotationAccessMode = "sandboxd.io/access-mode"
	// annotationDefaultClass marks the cluster's default StorageClass.
	annotationDefaultClass = "storageclass.kubernetes.io/is-default-class"
)

// claimBindWait bounds how long EnsureClaim waits for a claim it made to bind (a class
// that binds at once); WaitForFirstConsumer classes bind with the first Pod.
var claimBindWait = 20 * time.Second

var _ runtime.ClaimVolumes = (*Backend)(nil)

// ClaimNamespace implements runtime.ClaimVolumes.
func (b *Backend) ClaimNamespace() string { return b.cfg.Namespace }

func ineligible(format string, args ...any) error {
	return fmt.Errorf("%w: %s", runtime.ErrClaimIneligible, fmt.Sprintf(format, args...))
}

// EnsureClaim implements runtime.ClaimVolumes.
func (b *Backend) EnsureClaim(ctx context.Context, c runtime.Claim) (runtime.ClaimState, error) {
	if c.Org == "" || c.Name == "" || !runtime.KeepNamePattern.MatchString(c.Managed) {
		return runtime.ClaimState{}, fmt.Errorf("%w: claim %q: organization, name and managed name are required", runtime.ErrInvalidSpec, c.Name)
	}
	pvcs := b.cfg.Client.CoreV1().PersistentVolumeClaims(b.cfg.Namespace)
	pvc, err := pvcs.Get(ctx, c.Name, metav1.GetOptions{})
	made := false
	if apierrors.IsNotFound(err) {
		if pvc, err = b.makeClaim(ctx, c); err == nil {
			made = true
		} else if apierrors.IsAlreadyExists(err) {
			pvc, err = pvcs.Get(ctx, c.Name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return runtime.ClaimState{}, fmt.Errorf("claim %s: %w", c.Name, err)
	}
	ours := pvc.Labels[LabelManagedBy] == ManagedBy && pvc.Labels[LabelKind] == KindVolume
	switch {
	case pvc.Labels[LabelVolumeOrg] != runtime.OrgHash(c.Org):
		return runtime.ClaimState{}, ineligible("claim %q exists in namespace %q and is not granted to this organization (label %s=%s)", c.Name, b.cfg.Namespace, LabelVolumeOrg, runtime.OrgHash(c.Org))
	case ours && pvc.Labels[LabelRegisteredVolume] != c.Managed:
		return runtime.ClaimState{}, ineligible("claim %q holds another registered volume", c.Name)
	case pvc.DeletionTimestamp != nil:
		return runtime.ClaimState{}, ineligible("claim %q is being deleted", c.Name)
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	if c.AllowedStorageClasses != nil && !slices.Contains(c.AllowedStorageClasses, class) {
		return runtime.ClaimState{}, ineligible("claim %q has storage class %q, which the runner's policy does not allow (constraints.volumes.allowed_storage_classes: %s)", c.Name, class, strings.Join(c.AllowedStorageClasses, ", "))
	}
	if made && pvc.Status.Phase != corev1.ClaimBound {
		pvc = b.waitBound(ctx, pvc, class)
	}
	switch pvc.Status.Phase {
	case corev1.ClaimBound:
	case corev1.ClaimPending, "":
		if late, known := b.bindsLate(ctx, class); !known {
			b.log.Warn("claim Pending and its storage class unreadable: taken as binding with its first Pod", "claim", c.Name, "class", class)
		} else if !late {
			return runtime.ClaimState{}, ineligible("claim %q is Pending: no PersistentVolume binds it (its class %q binds at once; a cluster needs a provisioner for it or a matching volume)", c.Name, class)
		}
	default:
		return runtime.ClaimState{}, ineligible("claim %q is %s", c.Name, pvc.Status.Phase)
	}
	if pvc.Labels[LabelRegisteredVolume] != c.Managed {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{LabelRegisteredVolume: c.Managed}}})
		if pvc, err = pvcs.Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return runtime.ClaimState{}, fmt.Errorf("claim %s: label it: %w", c.Name, err)
		}
	}
	return runtime.ClaimState{CapacityBytes: claimCapacity(pvc), AccessModes: claimAccessModes(pvc)}, nil
}

var _ runtime.ClaimSizer = (*Backend)(nil)

// ClaimSize implements runtime.ClaimSizer: the larger of the claim's capacity and its
// request, when it exists and is granted to c.Org.
func (b *Backend) ClaimSize(ctx context.Context, c runtime.Claim) (int64, error) {
	pvc, err := b.cfg.Client.CoreV1().PersistentVolumeClaims(b.cfg.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("claim %s: %w", c.Name, err)
	case pvc.Labels[LabelVolumeOrg] != runtime.OrgHash(c.Org):
		return 0, nil
	}
	q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	return max(claimCapacity(pvc), q.Value()), nil
}

// makeClaim makes the claim of c: class c.StorageClass or the cluster's default, within
// the allowed classes.
func (b *Backend) makeClaim(ctx context.Context, c runtime.Claim) (*corev1.PersistentVolumeClaim, error) {
	class := c.StorageClass
	var sc *storagev1.StorageClass
	if class == "" {
		sc = b.defaultClass(ctx)
		if sc != nil {
			class = sc.Name
		}
	}
	if c.AllowedStorageClasses != nil && !slices.Contains(c.AllowedStorageClasses, class) {
		what := "the cluster has no default storage class"
		if class != "" {
			what = fmt.Sprintf("the cluster's default storage class %q is not among them", class)
		}
		if c.StorageClass != "" {
			what = fmt.Sprintf("base.volume_storage_class %q is not among them", class)
		}
		return nil, ineligible("no storage class for claim %q: the runner's policy allows %s and %s (set base.volume_storage_class)", c.Name, strings.Join(c.AllowedStorageClasses, ", "), what)
	}
	if sc == nil && class != "" {
		if got, err := b.cfg.Client.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{}); err == nil {
			sc = got
		}
	}
	size := c.SizeBytes
	if size <= 0 {
		size = runtime.DefaultClaimBytes
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: b.cfg.Namespace, Labels: map[string]string{
			LabelManagedBy: ManagedBy, LabelKind: KindVolume, LabelRunner: b.cfg.RunnerID,
			LabelVolumeOrg: runtime.OrgHash(c.Org), LabelRegisteredVolume: c.Managed,
		}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{accessModeOf(sc)},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI),
			}},
		},
	}
	if class != "" {
		pvc.Spec.StorageClassName = &class
	}
	return b.cfg.Client.CoreV1().PersistentVolumeClaims(b.cfg.Namespace).Create(ctx, pvc, metav1.CreateOptions{})
}

// accessModeOf is the access mode of claims of class sc: ReadWriteMany (sandboxes share
// a volume) unless the class's AnnotationAccessMode says its provisioner offers less.
func accessModeOf(sc *storagev1.StorageClass) corev1.PersistentVolumeAccessMode {
	if sc != nil {
		switch m := corev1.PersistentVolumeAccessMode(sc.Annotations[AnnotationAccessMode]); m {
		case corev1.ReadWriteOnce, corev1.ReadWriteOncePod:
			return m
		}
	}
	return corev1.ReadWriteMany
}

// defaultClass is the cluster's default StorageClass, nil when there is none (or the
// runner may not list classes).
func (b *Backend) defaultClass(ctx context.Context) *storagev1.StorageClass {
	l, err := b.cfg.Client.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.log.Warn("list storage classes", "err", err)
		return nil
	}
	for i := range l.Items {
		if l.Items[i].Annotations[annotationDefaultClass] == "true" {
			return &l.Items[i]
		}
	}
	return nil
}

// bindsLate reports whether class binds its claims when the first Pod uses them, and
// whether the backend could tell (a runner deployed by the chart may not read
// StorageClasses, which are cluster-scoped).
func (b *Backend) bindsLate(ctx context.Context, class string) (late, known bool) {
	if class == "" {
		return false, true
	}
	sc, err := b.cfg.Client.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{})
	if err != nil {
		return false, false
	}
	return sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer, true
}

// waitBound waits (claimBindWait at most) for a claim the backend made to bind, unless
// its class binds late; it returns the last view of the claim.
func (b *Backend) waitBound(ctx context.Context, pvc *corev1.PersistentVolumeClaim, class string) *corev1.PersistentVolumeClaim {
	if late, known := b.bindsLate(ctx, class); late || !known {
		return pvc
	}
	end := time.Now().Add(claimBindWait)
	for time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(250 * time.Millisecond)
		got, err := b.cfg.Client.CoreV1().PersistentVolumeClaims(b.cfg.Namespace).Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			break
		}
		if pvc = got; pvc.Status.Phase == corev1.ClaimBound {
			break
		}
	}
	return pvc
}

// claimCapacity is a claim's capacity: its bound volume's, else what it requests.
func claimCapacity(pvc *corev1.PersistentVolumeClaim) int64 {
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		return q.Value()
	}
	q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	return q.Value()
}

// claimAccessModes are a claim's access modes: its bound volume's (Status), else what
// it asks for (Spec), else ReadWriteOnce (Kubernetes' default for a claim naming none).
func claimAccessModes(pvc *corev1.PersistentVolumeClaim) []string {
	modes := pvc.Status.AccessModes
	if len(modes) == 0 {
		modes = pvc.Spec.AccessModes
	}
	if len(modes) == 0 {
		return []string{string(corev1.ReadWriteOnce)}
	}
	out := make([]string, 0, len(modes))
	for _, m := range modes {
		if !slices.Contains(out, string(m)) {
			out = append(out, string(m))
		}
	}
	return out
}

// RemoveClaim implements runtime.ClaimVolumes: deletes a claim the backend made for c,
// lets go of one it adopted, and leaves any other alone.
func (b *Backend) RemoveClaim(ctx context.Context, c runtime.Claim) error {
	pvcs := b.cfg.Client.CoreV1().PersistentVolumeClaims(b.cfg.Namespace)
	pvc, err := pvcs.Get(ctx, c.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("claim %s: %w", c.Name, err)
	}
	if pvc.Labels[LabelVolumeOrg] != runtime.OrgHash(c.Org) || pvc.Labels[LabelRegisteredVolume] != c.Managed {
		return nil // not this volume's
	}
	if pvc.Labels[LabelManagedBy] == ManagedBy && pvc.Labels[LabelKind] == KindVolume {
		err := pvcs.Delete(ctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pvc.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: delete: %w", c.Name, err)
		}
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{LabelRegisteredVolume: nil}}})
	if _, err := pvcs.Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("claim %s: let go: %w", c.Name, err)
	}
	return nil
}

// resolveClaims finds the claim of each of spec's registered volumes (Volume.Managed)
// among the claims granted to the spec's organization: Pod volume index → claim name,
// and the claims that one node at a time may mount (single: claim name → access mode).
func (b *Backend) resolveClaims(ctx context.Context, spec *runtime.Spec) (map[int]string, map[string]corev1.PersistentVolumeAccessMode, error) {
	var out map[int]string
	var single map[string]corev1.PersistentVolumeAccessMode
	for i, v := range spec.Volumes {
		if v.Managed == "" {
			continue
		}
		org := spec.Meta[runtime.MetaOrg]
		l, err := b.cfg.Client.CoreV1().PersistentVolumeClaims(b.cfg.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: LabelRegisteredVolume + "=" + v.Managed + "," + LabelVolumeOrg + "=" + runtime.OrgHash(org),
		})
		if err != nil {
			return nil, nil, fmt.Errorf("volume %q: claims: %w", v.Name, err)
		}
		if len(l.Items) != 1 {
			return nil, nil, fmt.Errorf("%w: volume %q: the registered volume has no claim on this runner (validate it again)", runtime.ErrInvalidSpec, v.Name)
		}
		if out == nil {
			out = map[int]string{}
		}
		out[i] = l.Items[0].Name
		if m := singleNodeMode(l.Items[0].Spec.AccessModes); m != "" {
			if single == nil {
				single = map[string]corev1.PersistentVolumeAccessMode{}
			}
			single[l.Items[0].Name] = m
		}
	}
	return out, single, nil
}

// singleNodeMode is ReadWriteOncePod or ReadWriteOnce when modes allow no more than one
// node (one Pod) to mount the claim, else "".
func singleNodeMode(modes []corev1.PersistentVolumeAccessMode) corev1.PersistentVolumeAccessMode {
	var out corev1.PersistentVolumeAccessMode
	for _, m := range modes {
		switch m {
		case corev1.ReadWriteMany, corev1.ReadOnlyMany:
			return ""
		case corev1.ReadWriteOnce:
			out = m
		case corev1.ReadWriteOncePod:
			if out == "" {
				out = m
			}
		}
	}
	return out
}

// claimNode is where a Pod mounting the single-node claims must run: the node of a live
// sandbox Pod that mounts one of them ("" when none does). A ReadWriteOnce claim
// mounted on two nodes (never by this backend) or a ReadWriteOncePod claim mounted at all
// is ErrInvalidSpec and ErrClaimIneligible naming the claim and the sandbox that holds it. (Two creates at
// once may both see it unmounted; the kubelet then refuses the second attach.)
func (b *Backend) claimNode(ctx context.Context, id string, single map[string]corev1.PersistentVolumeAccessMode) (string, error) {
	if len(single) == 0 {
		return "", nil
	}
	l, err := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy})
	if err != nil {
		return "", fmt.Errorf("claims: list the Pods mounting them: %w", err)
	}
	node, nodeOf := "", ""
	for i := range l.Items {
		p := &l.Items[i]
		if p.Labels[LabelSandbox] == id || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			claim := v.PersistentVolumeClaim.ClaimName
			m, ok := single[claim]
			if !ok {
				continue
			}
			holder := cmp.Or(p.Labels[LabelSandbox], p.Name)
			if m == corev1.ReadWriteOncePod {
				return "", fmt.Errorf("%w: %w: claim %q is ReadWriteOncePod and sandbox %s mounts it: one sandbox at a time", runtime.ErrInvalidSpec, runtime.ErrClaimIneligible, claim, holder)
			}
			switch {
			case p.Spec.NodeName == "":
				// Not scheduled yet: its node is not known; the scheduler places it.
			case node == "":
				node, nodeOf = p.Spec.NodeName, claim
			case node != p.Spec.NodeName:
				return "", fmt.Errorf("%w: %w: ReadWriteOnce claims %q and %q are mounted on different nodes (%s, %s): no node can mount both", runtime.ErrInvalidSpec, runtime.ErrClaimIneligible, nodeOf, claim, node, p.Spec.NodeName)
			}
		}
	}
	return node, nil
}

// pinToNode makes pod run on node only (required node affinity on the node's name, as a
// DaemonSet's Pods have).
func pinToNode(pod *corev1.Pod, node string) {
	if node == "" {
		return
	}
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	term := corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term}}
		return
	}
	// Terms are ORed: the node requirement goes into each.
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchFields = append(terms[i].MatchFields, term.MatchFields...)
	}
}

// applyClaims makes the Pod volumes of registered volumes (vol-<index>) claims.
func applyClaims(pod *corev1.Pod, claims map[int]string) {
	for i := range pod.Spec.Volumes {
		idx, ok := strings.CutPrefix(pod.Spec.Volumes[i].Name, "vol-")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(idx)
		if err != nil {
			continue
		}
		if claim, ok := claims[n]; ok {
			pod.Spec.Volumes[i].VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}
		}
	}
}
