package security

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestK8sRestoredScratchLiftsNoPodLimit (review of k8s-scratchfill, items 1-2): a scratch
// volume restored from a snapshot and mounted only by sub_path is filled through the
// runner's filler. The volume's size is the caller's (here 2^62): it must lift neither
// the Pod's ephemeral-storage cap (the sum of its containers' limits, else the primary's
// disk alone) nor its memory limit. A memory volume so restored is refused at create,
// before any Pod is made (its tmpfs pages would be the filler's, outside the sandbox's
// memory). Against a fake cluster whose Pods never run: the Pod made is what counts.
func TestK8sRestoredScratchLiftsNoPodLimit(t *testing.T) {
	cs := fake.NewSimpleClientset()
	made := recordPods(cs)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const disk = 1 << 30
	b, err := kubernetes.New(ctx, kubernetes.Config{Client: cs, Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
		StartTimeout: time.Second, MaxPrepull: -1, DiskBytes: disk, SnapshotCacheDir: filepath.Join(t.TempDir(), "cache")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	data := []byte("archive")
	sum := sha256.Sum256(data)
	d := hex.EncodeToString(sum[:])
	if err := b.PrepareSnapshot(ctx, d, runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 10}, func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}); err != nil {
		t.Fatal(err)
	}
	spec := func(id, medium string) *runtime.Spec {
		return &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sh",
			VolumeMounts: []runtime.VolumeMount{{Volume: "w", Path: "/ab", SubPath: "a/b"}}},
			Volumes: []runtime.Volume{{Name: "w", SizeBytes: 1 << 62, Medium: medium, RestoreDigest: d}}}
	}

	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = b.Create(cctx, spec("mem", runtime.MediumMemory))
	ccancel()
	if !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("a restored memory volume through the filler: %v, want ErrInvalidSpec", err)
	}
	if len(made()) != 0 {
		t.Errorf("a Pod was made for a refused memory restore")
	}

	cctx, ccancel = context.WithTimeout(ctx, 3*time.Second)
	_, _ = b.Create(cctx, spec("disk", runtime.MediumDisk))
	ccancel()
	pods := made()
	if len(pods) == 0 {
		t.Fatal("the Create made no Pod (the test no longer reaches the Pod's limits)")
	}
	for _, p := range pods {
		var eph int64
		filler := false
		for _, c := range p.Spec.Containers {
			if q, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
				eph += q.Value()
			}
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && q.Value() > 1<<40 {
				t.Errorf("Pod %s container %s: memory limit %s, lifted by the volume's size", p.Name, c.Name, q.String())
			}
			filler = filler || c.Name == "cw-object-store-agent-volumes"
		}
		if !filler {
			t.Errorf("Pod %s has no filler: the test no longer reaches a restore through it", p.Name)
		}
		if eph != disk {
			t.Errorf("Pod %s: ephemeral-storage limits sum to %d, want the primary's disk %d alone", p.Name, eph, disk)
		}
	}
}
