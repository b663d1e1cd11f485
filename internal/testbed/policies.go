package testbed

import "fmt"

// EdgePort is where the runners with an edge publish endpoints.
const EdgePort = 8443

// Standard is the bed the tests and scripts/testbed.sh use: three clusters that differ
// the way real ones do.
//   - strict: no GPUs, at most 1 CPU and 512Mi per sandbox, 10-minute lifetimes, 2 CPUs
//     in all, not overcommitted;
//   - open: permissive but for a one-day lifetime cap, room for 16 CPUs (more than this
//     host has: sandboxes' limits are caps, not reservations of real cores), and the only
//     edge: public endpoints land here, on EdgePort of its address; it also serves the
//     direct data plane (DataPlanePort);
//   - small: little room (1 CPU not overcommitted, 1Gi, 2 sandboxes), sandboxes of at
//     most 1Gi.
func Standard() []Runner {
	return []Runner{
		{ID: "strict", Policy: `{"constraints": {"resources": {"max_cpu": "1", "max_memory": "512Mi", "max_gpu": 0},
			"lifetime": {"max_seconds": 600}}}`, Args: []string{"--max-sandboxes", "20", "--cpu", "2", "--cpu-overcommit", "1", "--memory", "4Gi"}},
		{ID: "open", Policy: `{"constraints": {"lifetime": {"max_seconds": 86400}}}`,
			// -v: its log shows its direct data-plane clients (DEBUG; test/multicluster checks).
			Args: []string{"-v", "--cpu", "16", "--memory", "32Gi", "--edge-listen", fmt.Sprintf(":%d", EdgePort)}, DataPlane: true},
		{ID: "small", Policy: `{"constraints": {"resources": {"max_memory": "1Gi"}}}`,
			Args: []string{"--max-sandboxes", "2", "--cpu", "1", "--cpu-overcommit", "1", "--memory", "1Gi"}},
	}
}
