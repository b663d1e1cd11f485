package policy

import (
	"fmt"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// ConstraintPlatformSnapshots: the runner restores no file-system snapshots (no blob
// store, or a backend that cannot fill a volume from an archive): a sandbox whose scratch
// volume starts from one goes to a runner that can.
const ConstraintPlatformSnapshots = "platform.snapshots"

// checkSnapshots refuses restores on a runner that takes no snapshots.
func (r *resolver) checkSnapshots(s *sandboxv1.SandboxSpec) {
	if !r.pl.NoSnapshots {
		return
	}
	for i, v := range s.GetVolumes() {
		if v.GetScratch().GetRestoreFromSnapshotId() != "" {
			r.add(fmt.Sprintf("sandbox.spec.volumes[%d].scratch.restore_from_snapshot_id", i), ConstraintPlatformSnapshots, "none", false,
				"this runner restores no file-system snapshots; pick a runner that does")
		}
	}
}
