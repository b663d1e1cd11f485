package kubernetes

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// GVisorClass is the sandbox runtime class whose Pods run under gVisor (a RuntimeClass
// whose handler is gVisor's containerd shim, runsc), the same name as the local backend's.
const GVisorClass = "gvisor"

// gvisorMountAnnotation is gVisor's containerd shim's prefix of Pod-level mount hints
// (dev.gvisor.spec.mount.<volume>.<field>); containerd passes them on only to a runtime
// whose pod_annotations list dev.gvisor.* (deploy/README.md, test/k8s/up.sh).
const gvisorMountAnnotation = "dev.gvisor.spec.mount."

// gvisorBinBytes is what the gate's bin dir (sandbox-gate and sandbox-agent, ~20 MiB)
// takes of the sentry's memory when it is a tmpfs (addGVisorHints with binTmpfs): added
// to the gate container's memory request and limit, with room to spare.
const gvisorBinBytes = 32 << 20

// addGVisorHints marks, in a gVisor Pod, the emptyDirs that carry agents' sockets (those
// mounted at the gate's run dir, or below its containers dir, by any container) as tmpfs
// shared by the Pod's containers inside the sentry, and, with binTmpfs (a pausable
// sandbox on a runner with node agents), the gate's bin dir too (the gate and agent
// binaries the containers execute; gvisorBinBytes more memory for the gate container).
// Without the hint each container mounts the directory through its own gofer, and a unix
// socket bound in one container is not there for the gate in another: the gate never
// reaches the agent. The bin dir in the sentry's memory is what lets a checkpoint of the
// Pod (checkpoint.go) restore into a new Pod: a host-backed emptyDir is not in the
// checkpoint, and the new Pod's is empty, so the restored processes' executables would
// be gone. Other emptyDirs stay host-backed bind mounts, which runsc keeps coherent
// between containers (--file-access-mounts=shared).
func addGVisorHints(pod *corev1.Pod, class string, binTmpfs bool) {
	if class != GVisorClass {
		return
	}
	sockets := map[string]bool{}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, m := range c.VolumeMounts {
				if m.MountPath == gate.RunDir || binTmpfs && m.MountPath == gate.BinDir || strings.HasPrefix(m.MountPath, gate.ContainersDir+"/") {
					sockets[m.Name] = true
				}
			}
		}
	}
	if binTmpfs {
		for i := range pod.Spec.Containers {
			if c := &pod.Spec.Containers[i]; c.Name == containerGate {
				c.Resources = *c.Resources.DeepCopy()
				addMemory(c.Resources.Requests, gvisorBinBytes)
				addMemory(c.Resources.Limits, gvisorBinBytes)
			}
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil || !sockets[v.Name] {
			continue
		}
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		k := gvisorMountAnnotation + v.Name + "."
		pod.Annotations[k+"share"] = "pod"
		pod.Annotations[k+"type"] = "tmpfs"
		pod.Annotations[k+"options"] = "rw,rprivate"
	}
}

// addMemory adds n bytes to l's memory, when l has one.
func addMemory(l corev1.ResourceList, n int64) {
	if q, ok := l[corev1.ResourceMemory]; ok {
		q.Add(*resource.NewQuantity(n, resource.BinarySI))
		l[corev1.ResourceMemory] = q
	}
}

// checkRuntimeClasses validates Config.RuntimeClasses (nil: none configured): the default
// class among them, each RuntimeClass name "" (the cluster's default runtime) or a DNS
// subdomain, each class name a DNS label.
func checkRuntimeClasses(m map[string]string, def string) error {
	if m == nil {
		return nil
	}
	if _, ok := m[def]; !ok {
		return fmt.Errorf("kubernetes backend: RuntimeClasses has no entry for the default class %q", def)
	}
	for class, name := range m {
		if errs := validation.IsDNS1123Label(class); len(errs) > 0 {
			return fmt.Errorf("kubernetes backend: runtime class %q: %s", class, strings.Join(errs, "; "))
		}
		if name == "" {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return fmt.Errorf("kubernetes backend: RuntimeClass name %q of class %q: %s", name, class, strings.Join(errs, "; "))
		}
	}
	return nil
}

// RuntimeClasses implements runtime.RuntimeClassLister: the configured classes, the
// default first, the rest in name order; nil when none are configured (the runner then
// offers its default class only).
func (b *Backend) RuntimeClasses() []string {
	if b.cfg.RuntimeClasses == nil {
		return nil
	}
	var rest []string
	for c := range b.cfg.RuntimeClasses {
		if c != b.cfg.DefaultRuntimeClass {
			rest = append(rest, c)
		}
	}
	slices.Sort(rest)
	return append([]string{b.cfg.DefaultRuntimeClass}, rest...)
}
