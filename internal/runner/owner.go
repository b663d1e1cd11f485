package runner

// OwnedHandle is a runner whose owner is vouched for by something other than the runner
// (runnerapi.Client: the certificate the control plane issued it at registration). A
// runner that belongs to an organization (a tenant's: its cluster, its host) takes that
// organization's sandboxes, templates, builds and volumes only (placement.Serves); a
// Handle that is no OwnedHandle (an in-process Local) is the platform's.
type OwnedHandle interface {
	// Owner is the organization the runner belongs to ("" = the platform's: its
	// certificate is explicitly marked so, pki.PlatformRunnerURI),
	// and whether that is known yet (a remote runner's once its certificate was
	// verified; until then it takes nothing).
	Owner() (org string, known bool)
}
