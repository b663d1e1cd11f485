package security

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// TestK8sCreateFailureWording: when runc cannot create a sandbox's container, its
// message quotes the spec's paths (a working_dir, a mount point), which the caller
// chooses. A caller that words a path as a node fault ("cgroup", "no space left on
// device", "context deadline exceeded"), fills it with escape sequences and makes it
// huge still gets its own failure: reason StartError (the spec's, not BackendError,
// which would count against the runner's health), a message of at most 1 KiB of
// printable UTF-8 naming the container (the fixed words, then at most 1 KiB of the runtime's message). (Recover of such a Pod: the same check Create's
// wait uses.)
func TestK8sCreateFailureWording(t *testing.T) {
	const id, runner = "cfword1", "r1"
	spec := runtime.Spec{ID: id, Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh"},
		Meta: map[string]string{runtime.MetaOrg: "org-a"}}
	path := "/x/cgroup: no space left on device: context deadline exceeded: code = Unavailable\x1b]8;;https://evil.example\x07\n" + strings.Repeat("\xff/cgroup", 1<<18)
	msg := "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: mkdir " + path + ": read-only file system: unknown"
	_, ex := recoverEnded(t, runner, spec, corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "gate", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}},
		{Name: "sandbox", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError",
			Message: msg, StartedAt: metav1.Unix(0, 0), FinishedAt: metav1.Now()}}},
	}})
	if ex.Reason != "StartError" {
		t.Errorf("reason %q, want StartError: the caller's path worded as a node fault made it the runner's", ex.Reason)
	}
	// The fixed words naming the container and the reason, then the runtime's message
	// quoted at most kubernetes.MaxStartMessage (1 KiB) bytes.
	const prefix = `invalid sandbox spec: container "app" could not be created or started: StartError (exit code 128): `
	if !strings.HasPrefix(ex.Message, prefix) || len(ex.Message) > len(prefix)+kubernetes.MaxStartMessage || !textclip.AllPrintable(ex.Message) {
		t.Errorf("message of %d bytes (printable %v), want %q and at most %d bytes of printable text: %.300q",
			len(ex.Message), textclip.AllPrintable(ex.Message), prefix, len(prefix)+kubernetes.MaxStartMessage, ex.Message)
	}
}
