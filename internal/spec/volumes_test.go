package spec

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestScratchVolumeConversion(t *testing.T) {
	scratch := func(name, size string, m sandboxv1.StorageMedium) *sandboxv1.SandboxVolume {
		return &sandboxv1.SandboxVolume{Name: name, Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{Size: size, Medium: m}}}
	}
	mount := func(vol, path string) *sandboxv1.VolumeMount {
		return &sandboxv1.VolumeMount{Volume: vol, MountPath: path}
	}
	const c0 = "sandbox.spec.containers[0]"
	for _, tc := range []struct {
		name   string
		vols   []*sandboxv1.SandboxVolume
		mounts []*sandboxv1.VolumeMount
		want   []runtime.Volume
		code   connect.Code // 0: accepted
		field  string
	}{
		{"disk and memory", []*sandboxv1.SandboxVolume{scratch("data", "1Gi", sandboxv1.StorageMedium_STORAGE_MEDIUM_DISK), scratch("mem", "64Mi", sandboxv1.StorageMedium_STORAGE_MEDIUM_MEMORY)},
			[]*sandboxv1.VolumeMount{mount("data", "/data"), {Volume: "mem", MountPath: "/m", ReadOnly: true, SubPath: "a/b"}},
			[]runtime.Volume{{Name: "data", SizeBytes: 1 << 30}, {Name: "mem", SizeBytes: 64 << 20, Medium: runtime.MediumMemory}}, 0, ""},
		{"unset source is a default scratch volume", []*sandboxv1.SandboxVolume{{Name: "tmp"}}, []*sandboxv1.VolumeMount{mount("tmp", "/work")},
			[]runtime.Volume{{Name: "tmp"}}, 0, ""},
		{"bad size", []*sandboxv1.SandboxVolume{scratch("d", "lots", 0)}, nil, nil, connect.CodeInvalidArgument, "sandbox.spec.volumes[0].scratch.size"},
		{"bad name", []*sandboxv1.SandboxVolume{{Name: "Data_1"}}, nil, nil, connect.CodeInvalidArgument, "sandbox.spec.volumes[0].name"},
		{"undeclared volume", nil, []*sandboxv1.VolumeMount{mount("nope", "/x")}, nil, connect.CodeInvalidArgument, c0 + ".volume_mounts[0].volume"},
		{"reserved path", []*sandboxv1.SandboxVolume{{Name: "v"}}, []*sandboxv1.VolumeMount{mount("v", "/proc")}, nil, connect.CodeInvalidArgument, c0 + ".volume_mounts[0].mount_path"},
		{"escaping sub_path", []*sandboxv1.SandboxVolume{{Name: "v"}}, []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/v", SubPath: "../../etc"}}, nil, connect.CodeInvalidArgument, c0 + ".volume_mounts[0].sub_path"},
		{"sub_path over 4096 bytes", []*sandboxv1.SandboxVolume{{Name: "v"}}, []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/v", SubPath: strings.Repeat("a/", 2048) + "a"}}, nil, connect.CodeInvalidArgument, c0 + ".volume_mounts[0].sub_path"},
		{"sub_path component over 255 bytes", []*sandboxv1.SandboxVolume{{Name: "v"}}, []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/v", SubPath: "a/" + strings.Repeat("n", 256)}}, nil, connect.CodeInvalidArgument, c0 + ".volume_mounts[0].sub_path"},
		{"sub_path at the bounds", []*sandboxv1.SandboxVolume{{Name: "v"}}, []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/v", SubPath: strings.Repeat(strings.Repeat("n", 255)+"/", 15) + strings.Repeat("n", 255)}},
			[]runtime.Volume{{Name: "v"}}, 0, ""},
		{"persistent volumes are not supported yet", []*sandboxv1.SandboxVolume{{Name: "p", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "vol-1"}}}, nil, nil, connect.CodeUnimplemented, "volume_id"},
		{"snapshots are not supported yet", []*sandboxv1.SandboxVolume{{Name: "s", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{RestoreFromSnapshotId: "snap"}}}}, nil, nil, connect.CodeUnimplemented, "snapshots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &sandboxv1.SandboxSpec{Volumes: tc.vols, Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", VolumeMounts: tc.mounts}}}
			req, err := ToCreateRequest(spec)
			if tc.code != 0 {
				if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.field) {
					t.Fatalf("err = %v, want %v naming %s", err, tc.code, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(req.Spec.Volumes, tc.want) || len(req.Spec.VolumeMounts) != len(tc.mounts) {
				t.Errorf("volumes %+v mounts %+v, want %+v", req.Spec.Volumes, req.Spec.VolumeMounts, tc.want)
			}
			if err := runtime.ValidateVolumes(req.Spec.Volumes, req.Spec.VolumeMounts); err != nil {
				t.Errorf("the runtime refuses what the gateway accepted: %v", err)
			}
		})
	}
}

// TestRestoreConversion: with a Restorer, a scratch volume's restore_from_snapshot_id
// becomes Restores[volume]; the restorer's refusal is the create's error; a sized volume
// smaller than the snapshot's content is CWSANDBOX_FSS_SIZE_EXCEEDED on its size field;
// the lookups happen only for an otherwise valid spec.
func TestRestoreConversion(t *testing.T) {
	restoring := func(size string) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox",
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "workspace", MountPath: "/w"}}}},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "other"}, {Name: "workspace", Source: &sandboxv1.SandboxVolume_Scratch{
				Scratch: &sandboxv1.ScratchVolume{Size: size, RestoreFromSnapshotId: "snap1"}}}}}
	}
	src := runner.SnapshotSource{SnapshotID: "snap1", BlobKey: "fss/o/snap1.tar.zst", Digest: "ab", SizeBytes: 10, ContentBytes: 2 << 20}
	var asked []string
	restore := func(field, id string) (runner.SnapshotSource, error) {
		asked = append(asked, field+"="+id)
		return src, nil
	}
	req, err := Convert(restoring(""), Options{Restore: restore})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(req.Restores, map[string]runner.SnapshotSource{"workspace": src}) ||
		!reflect.DeepEqual(asked, []string{"sandbox.spec.volumes[1].scratch.restore_from_snapshot_id=snap1"}) {
		t.Fatalf("restores %v, asked %v", req.Restores, asked)
	}
	if _, err := Convert(restoring("4Mi"), Options{Restore: restore}); err != nil {
		t.Fatalf("a volume larger than the content: %v", err)
	}
	_, err = Convert(restoring("1Mi"), Options{Restore: restore})
	if apierr.Reason(err) != apierr.FSSSizeExceeded || len(apierr.Violations(err)) != 1 ||
		apierr.Violations(err)[0].Field != "sandbox.spec.volumes[1].scratch.size" {
		t.Fatalf("a volume smaller than the content: %v %v", err, apierr.Violations(err))
	}
	refusal := apierr.New(apierr.FSSNotReady, "not ready", nil)
	if _, err := Convert(restoring(""), Options{Restore: func(string, string) (runner.SnapshotSource, error) { return src, refusal }}); !errors.Is(err, refusal) {
		t.Fatalf("the restorer's refusal became %v", err)
	}
	asked = nil
	bad := restoring("")
	bad.Containers[0].Image = ""
	if _, err := Convert(bad, Options{Restore: restore}); connect.CodeOf(err) != connect.CodeInvalidArgument || len(asked) > 0 {
		t.Fatalf("an invalid spec: %v, looked up %v", err, asked)
	}
	if _, err := ToCreateRequest(restoring("")); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("without a restorer: %v, want UNIMPLEMENTED", err)
	}
	long := restoring("")
	long.Volumes[1].GetScratch().RestoreFromSnapshotId = strings.Repeat("x", MaxSnapshotIDBytes+1)
	if _, err := Convert(long, Options{Restore: restore}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("an overlong snapshot id: %v", err)
	}
}
