package runner

import (
	"context"
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRecordSharesNothing: the runner's record of a sandbox shares nothing with the spec
// it was created from nor with the snapshots it hands out (runtime.Spec.Clone), so a
// caller changing either cannot change what the runner runs and reports.
func TestRecordSharesNothing(t *testing.T) {
	be := runtimetest.NewFake()
	defer be.Close()
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	uid := uint32(1000)
	spec := func() runtime.Spec {
		u := uid
		return runtime.Spec{Container: runtime.Container{Image: "busybox", Security: &runtime.Security{RunAsUser: &u, CapAdd: []string{"CAP_NET_ADMIN"}}, VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/v"}}},
			Volumes: []runtime.Volume{{Name: "v"}},
			Pod:     &runtime.PodSettings{NodeSelector: map[string]string{"pool": "a"}, Tolerations: []runtime.Toleration{{Key: "k"}}},
		}
	}
	change := func(s *runtime.Spec) {
		*s.Security.RunAsUser = 0
		s.Security.CapAdd[0] = "CAP_SYS_ADMIN"
		s.Volumes[0].Name = "w"
		s.VolumeMounts[0].Path = "/"
		s.Pod.NodeSelector["pool"] = "b"
		s.Pod.Tolerations[0].Key = "other"
	}
	asked := spec()
	sb, err := r.Create(context.Background(), CreateRequest{Spec: asked})
	if err != nil {
		t.Fatal(err)
	}
	want := spec()
	change(&asked)
	change(&sb.Spec)
	got, err := r.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Security", "Volumes", "VolumeMounts", "Pod"} {
		if g, w := reflect.ValueOf(got.Spec).FieldByName(f).Interface(), reflect.ValueOf(want).FieldByName(f).Interface(); !reflect.DeepEqual(g, w) {
			t.Errorf("the runner's record of %s changed with its caller's copies: %+v", f, g)
		}
	}
}
