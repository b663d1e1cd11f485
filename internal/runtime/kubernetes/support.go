package kubernetes

import "github.com/sandboxd/sandboxd/internal/runtime"

// Support: NetworkPolicy matches peers by address and labels, never by TLS server name, so
// host-name egress rules are enforced only with the runner's egress proxy and DNS
// (Config.Egress, egress.go); without them the runner refuses such rules and the gateway
// places such sandboxes on runners that can. Egress secrets go with the same proxy (it
// terminates the sandbox's TLS to their hosts with the sandbox's own CA: egress.go), so
// a runner without it refuses them too (NoEgressSecrets), as does one whose Role does not
// let it write its roots ConfigMap (Backend.noEgressSecrets: an upgrade before the Role's). Everything else is enforced: cidr/any as
// ipBlocks, tenants by label (organization, caller hash). (Sandbox networks are refused
// by the gateway on every runner.) Container-engine sandboxes are not done here: Docker
// Engine in a Pod needs a runtime class that hosts it safely (gVisor), which this backend
// does not yet set up, so it runs none and Create refuses them. File-system snapshots
// need a snapshot cache directory (snapshot.go).
func (b *Backend) Support() runtime.Support {
	return runtime.Support{NoDNSEgress: b.cfg.Egress == nil, NoEgressSecrets: b.cfg.Egress == nil || b.noEgressSecrets != "", NoContainerEngine: true, NoSnapshots: b.cfg.SnapshotCacheDir == "",
		// GLOBAL volumes: copies are filled through the filler (globalvol.go) from the
		// snapshot cache (none without one: NoGlobalVolumes), and a writer's copy is
		// archived through it once the workload stopped (the Pod outlives the workload
		// until then). A sub_path mount of one works: the copy is filled once the kubelet
		// has made the sub-directories, into them (snapshot.go subPaths).
		NoGlobalVolumes: b.cfg.SnapshotCacheDir == ""}
}

// The optional backend interfaces the Kubernetes backend implements (EgressReserver is
// asserted next to ReservedEgress).
var (
	_ runtime.SupportReporter    = (*Backend)(nil)
	_ runtime.LogDirProvider     = (*Backend)(nil)
	_ runtime.ContainerLogOpener = (*Backend)(nil)
)
