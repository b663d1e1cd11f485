package policy

import (
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// TestPlatformNoSnapshots: a runner that takes no snapshots refuses a volume restoring
// one, as its lack (CWSANDBOX_NO_SUITABLE_RUNNER: another runner may), and only that.
func TestPlatformNoSnapshots(t *testing.T) {
	pl := DefaultPlatform()
	pl.NoSnapshots = true
	s := spec(func(s *sandboxv1.SandboxSpec) {
		s.Volumes = []*sandboxv1.SandboxVolume{{Name: "plain"}, {Name: "workspace", Source: &sandboxv1.SandboxVolume_Scratch{
			Scratch: &sandboxv1.ScratchVolume{RestoreFromSnapshotId: "snap1"}}}}
	})
	_, vs := Resolve(nil, s, pl)
	if len(vs) != 1 || vs[0].Field != "sandbox.spec.volumes[1].scratch.restore_from_snapshot_id" ||
		vs[0].Constraint != ConstraintPlatformSnapshots || Reason(vs) != apierr.NoSuitableRunner {
		t.Errorf("violations %s", fmtVs(vs))
	}
	if _, vs := Resolve(nil, spec(), pl); len(vs) > 0 {
		t.Errorf("a sandbox restoring nothing: %s", fmtVs(vs))
	}
	pl.NoSnapshots = false
	if _, vs := Resolve(nil, s, pl); len(vs) > 0 {
		t.Errorf("a runner taking snapshots: %s", fmtVs(vs))
	}
}
