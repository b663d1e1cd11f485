package k8s

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestPVCReadWriteOnce: a class annotated ReadWriteOnce (sandboxd.io/access-mode) makes
// ReadWriteOnce claims; a second sandbox mounting one that a live sandbox mounts is pinned
// to that sandbox's node (required node affinity), and both run.
func TestPVCReadWriteOnce(t *testing.T) {
	c, s, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	class := randomID("sbx-rwo-")
	immediate := storagev1.VolumeBindingImmediate
	if _, err := s.Client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: class, Annotations: map[string]string{kubernetes.AnnotationAccessMode: string(corev1.ReadWriteOnce)}},
		Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &immediate,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pv")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o777)
	hostPathType := corev1.HostPathDirectory
	if _, err := s.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName: class, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := randomID("vol-")
	t.Cleanup(func() {
		ctx := context.Background()
		_ = s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Delete(ctx, claim, metav1.DeleteOptions{})
		_ = s.Client.CoreV1().PersistentVolumes().Delete(ctx, class, metav1.DeleteOptions{})
		_ = s.Client.StorageV1().StorageClasses().Delete(ctx, class, metav1.DeleteOptions{})
	})
	org := "org-" + class
	vol := runner.RegisteredVolume{Org: org, ClaimName: claim, Namespace: c.namespace, SizeBytes: 1 << 30,
		StorageClass: class, AllowedStorageClasses: []string{class}}
	if _, err := s.Runner.EnsureVolume(ctx, vol); err != nil {
		t.Fatal(err)
	}
	pvc, err := s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil || len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce {
		t.Fatalf("claim modes: %v %v", err, pvc.Spec.AccessModes)
	}
	create := func() *corev1.Pod {
		t.Helper()
		sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
			Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"},
				VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}}},
			Volumes: []runtime.Volume{{Name: "data", Managed: vol.ManagedName()}},
			Meta:    map[string]string{runtime.MetaOrg: org},
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = s.Runner.Delete(sb.ID, 0) })
		waitState(t, s.Runner, sb.ID, 2*time.Minute, running)
		pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+sb.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}
	first := create()
	if first.Spec.Affinity != nil && first.Spec.Affinity.NodeAffinity != nil {
		t.Errorf("the first mount is pinned: %+v", first.Spec.Affinity)
	}
	second := create()
	a := second.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("second mount not pinned: %+v", a)
	}
	f := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields
	if len(f) != 1 || f[0].Values[0] != first.Spec.NodeName || second.Spec.NodeName != first.Spec.NodeName {
		t.Errorf("second mount pinned to %+v (runs on %s), want %s", f, second.Spec.NodeName, first.Spec.NodeName)
	}
}
