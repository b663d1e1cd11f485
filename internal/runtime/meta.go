package runtime

// Keys of Spec.Meta, the one home of them all. Backends persist Meta with the spec (the
// local backend in its state dir, the Kubernetes backend in a Secret) and hand it back
// from Recover, and the runner keeps it in its records of ended sandboxes, so these
// strings are an on-disk format: never change one (TestMetaKeysStable holds them).
const (
	// MetaOrg is the organization that owns the sandbox. Written by the gateway that
	// places it; read by the backends (sandboxes of one organization reach each other's
	// private ports; the Kubernetes org label), the runner's edge and data plane (which
	// organization may reach it) and the gateway (its index, per-organization counts).
	MetaOrg = "sandboxd.org"
	// MetaCaller is the API key that created the sandbox. Written by the gateway; read by
	// the backends: tenant SAME_USER rules match the sandboxes of the same caller.
	MetaCaller = "sandboxd.caller"
	// MetaPolicyRevision is the revision of the runner policy the sandbox was admitted
	// under. Written by the gateway (its view of the runner's policy), then replaced by
	// the runner's own policy check (runnerapi), which keeps the gateway's under
	// MetaGatewayPolicyRevision when the two differ.
	MetaPolicyRevision        = "sandboxd.policy_revision"
	MetaGatewayPolicyRevision = "sandboxd.gateway_policy_revision"
	// MetaCreatedAt (RFC 3339, nanoseconds) and MetaLifetime (a time.Duration string)
	// are when the sandbox was created and how long it may live. Written by the runner
	// at create; read by the runner when it re-adopts the sandbox after a restart, to
	// keep its deadline.
	MetaCreatedAt = "sandboxd.created_at"
	MetaLifetime  = "sandboxd.lifetime"
	// MetaPauseLifetime is "held" when the sandbox's lifetime does not count while it is
	// paused ("" or absent: it counts), MetaAutoResume "false" when exec, files and
	// endpoint traffic must not resume a paused sandbox by default ("" or absent: they
	// do), and MetaIdlePause a time.Duration string: pause the sandbox after that long
	// without exec, files or endpoint traffic ("" or absent: never). Written by the
	// gateway from the runner policy's pause settings (policy.PauseSettings) at create;
	// read by the runner.
	MetaPauseLifetime = "sandboxd.pause.lifetime"
	MetaAutoResume    = "sandboxd.pause.auto_resume"
	MetaIdlePause     = "sandboxd.pause.idle"
	// MetaForkedFrom is the sandbox a fork was made from. Written by the runner.
	MetaForkedFrom = "sandboxd.forked_from"
	// MetaAnyID is "true" when the caller of a runner's Create takes the sandbox under
	// the ID the runner answers with rather than Spec.ID (the gateway does: it indexes
	// the answer's ID): a runner whose backend keeps warm sandboxes under their own IDs
	// (WarmReserver) then names the sandbox after the warm one it claims. Written by the
	// gateway, to platform runners only (it checks the answered ID: no record may have
	// it); removed by the runner before anything is persisted.
	MetaAnyID = "sandboxd.any_id"
)
