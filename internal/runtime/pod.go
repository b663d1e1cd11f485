package runtime

import "strings"

// PodSettings are a policy's Kubernetes Pod settings (the policy's base pod fragment):
// where a sandbox's Pod may be scheduled and what it runs as. Backends other than
// Kubernetes ignore them. The policy document uses this shape (policy.base.pod).
type PodSettings struct {
	NodeSelector       map[string]string `json:"node_selector,omitempty"`
	Tolerations        []Toleration      `json:"tolerations,omitempty"`
	PriorityClassName  string            `json:"priority_class_name,omitempty"`
	ServiceAccountName string            `json:"service_account_name,omitempty"`
	// ImagePullSecrets name Secrets in the runner's namespace.
	ImagePullSecrets []string `json:"image_pull_secrets,omitempty"`
	// Annotations go on the Pod (not on the sandbox). No key may have the prefix
	// ReservedPodAnnotationPrefix (the policy's validation refuses it).
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ReservedPodAnnotationPrefix is the prefix of the annotation keys the Kubernetes backend
// keeps for its own state on a sandbox's Pod (sandboxd.io/workload-started marks a
// GLOBAL volume writer's workload started: its copy is committed only then;
// sandboxd.io/warm-claimed marks a Pod claimed from the warm pool, its value the claim's
// time). Pod annotations from a policy may not use it: one would forge that state (the
// backend also drops such keys from a policy stored before the check).
const ReservedPodAnnotationPrefix = "sandboxd.io/"

// GVisorPodAnnotationPrefix is gVisor's: its containerd shim reads mount hints and runsc
// settings from Pod annotations under it (the backend sets the hints of a gVisor Pod's
// agent sockets). Pod annotations from a policy may not use it either: one could reshape
// a gVisor Pod's mounts.
const GVisorPodAnnotationPrefix = "dev.gvisor."

// ShimPodAnnotationPrefix is the prefix of the Pod annotations sandboxd's patched gVisor
// shim reads (scripts/build-runsc-shim.sh): RestoreCheckpointAnnotation. Pod annotations
// from a policy may not use it: one would restore a Pod from a checkpoint of another
// sandbox on its node. On the cluster's side the runner chart's ValidatingAdmissionPolicy
// (templates/shim-admission.yaml, with the node agent) refuses every key under it from
// anyone but the runner's service account, in every namespace.
const ShimPodAnnotationPrefix = "dev.sandboxd."

// RestoreCheckpointAnnotation on a Pod of the patched gVisor shim restores its containers
// from the node's checkpoint image of that ID (<sandboxd_checkpoint_root>/<id>, the shim's
// config) instead of starting them: the resume of a paused sandbox.
const RestoreCheckpointAnnotation = ShimPodAnnotationPrefix + "restore.checkpoint-id"

// ReservedPodAnnotation reports the reserved prefix k falls under, if any.
func ReservedPodAnnotation(k string) (prefix string, reserved bool) {
	for _, p := range []string{ReservedPodAnnotationPrefix, GVisorPodAnnotationPrefix, ShimPodAnnotationPrefix} {
		if strings.HasPrefix(k, p) {
			return p, true
		}
	}
	return "", false
}

// Toleration is a Kubernetes toleration.
type Toleration struct {
	Key string `json:"key,omitempty"`
	// Operator is Exists or Equal ("" = Equal).
	Operator string `json:"operator,omitempty"`
	Value    string `json:"value,omitempty"`
	// Effect is NoSchedule, PreferNoSchedule, NoExecute or "" (all).
	Effect string `json:"effect,omitempty"`
	// TolerationSeconds (NoExecute only) bounds how long the Pod stays after the taint.
	TolerationSeconds *int64 `json:"toleration_seconds,omitempty"`
}

// IsZero reports whether p sets nothing.
func (p *PodSettings) IsZero() bool {
	return p == nil || (len(p.NodeSelector) == 0 && len(p.Tolerations) == 0 && p.PriorityClassName == "" &&
		p.ServiceAccountName == "" && len(p.ImagePullSecrets) == 0 && len(p.Annotations) == 0)
}
