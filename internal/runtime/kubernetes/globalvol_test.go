package kubernetes

import "testing"

// TestNoGlobalVolumes: the Kubernetes backend says it cannot hold GLOBAL volumes (it fills
// a restored volume through a writable mount and cannot capture one after its Pod
// stopped), so its runner refuses them at create and placement sends them elsewhere.
func TestNoGlobalVolumes(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} { // with and without a snapshot cache
		b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", SnapshotCacheDir: dir}, sandboxes: map[string]*sandbox{}}
		if !b.Support().NoGlobalVolumes {
			t.Errorf("snapshot cache %q: Support does not say NoGlobalVolumes", dir)
		}
	}
}
