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
)
