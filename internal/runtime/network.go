package runtime

// Network is a sandbox's effective network rules: allow-only over default deny, already
// merged with the policy's defaults and checked against its envelopes. A backend enforces
// them outside the sandbox, so nothing inside can undo them.
//
// The zero value allows no egress and no ingress (but the platform DNS always answers).
// Whoever builds a Spec fills in the platform default (see DefaultEgress) when neither
// sandbox nor policy declared rules.
type Network struct {
	// DenyEgress: nothing leaves the sandbox except queries to the platform DNS.
	// Egress is empty when it is set.
	DenyEgress bool         `json:"deny_egress,omitempty"`
	Egress     []EgressRule `json:"egress,omitempty"`
	// Ingress rules open the sandbox's CUSTOM-visibility services; PUBLIC and PRIVATE
	// services are reachable as their visibility says, whatever these rules are.
	DenyIngress bool          `json:"deny_ingress,omitempty"`
	Ingress     []IngressRule `json:"ingress,omitempty"`
}

// Tenant scopes of an egress or ingress rule.
const (
	TenantSameOrg        = "same_org"        // sandboxes of the sandbox's organization
	TenantSameUser       = "same_user"       // sandboxes created by the same caller
	TenantSandboxNetwork = "sandbox_network" // sandboxes attached to the same network
)

// EgressRule allows traffic to one destination. Exactly one of CIDR, DNSName, Tenant and
// Any is set.
type EgressRule struct {
	// CIDR is an IPv4 or IPv6 prefix ("203.0.113.0/24"); Except carves prefixes out of it.
	CIDR   string   `json:"cidr,omitempty"`
	Except []string `json:"except,omitempty"`
	// DNSName grants HTTPS (TCP 443) to an exact host name or to one leftmost wildcard
	// label ("*.example.com" matches a.example.com, not a.b.example.com). It is enforced
	// on the TLS ClientHello's server name, so connecting to a raw IP does not pass.
	DNSName string `json:"dns_name,omitempty"`
	// Tenant is one of the Tenant* scopes.
	Tenant string `json:"tenant,omitempty"`
	// Any is the internet: everything except cluster-internal (RFC 1918, CGNAT),
	// loopback, link-local (including cloud metadata), multicast and the host's own
	// addresses.
	Any bool `json:"any,omitempty"`
	// Ports limits the rule; empty means every port and protocol.
	Ports []PortRange `json:"ports,omitempty"`
	// Secret, on a DNSName rule naming one exact host, is a secret the backend's egress
	// proxy puts into the sandbox's HTTPS requests to that host in place of a placeholder
	// (docs/secrets.md, "Secrets that never enter the sandbox"). Its value is never here:
	// Spec.EgressSecretValues holds it, in memory only.
	Secret *EgressSecret `json:"secret,omitempty"`
}

// EgressSecret attaches a secret of the organization's stores to a host-name rule.
type EgressSecret struct {
	Store string `json:"store"`
	Path  string `json:"path"`
	Field string `json:"field,omitempty"`
	// Header is the request header that gets the value in place of the placeholder
	// (DefaultEgressSecretHeader when empty).
	Header string `json:"header,omitempty"`
	// EnvVar is the variable that holds the placeholder, in every container of the sandbox.
	EnvVar string `json:"env_var"`
}

// DefaultEgressSecretHeader is the header an EgressSecret fills when it names none.
const DefaultEgressSecretHeader = "Authorization"

// Key names the secret (store/path or store/path#field): Spec.EgressSecretValues' key.
func (e *EgressSecret) Key() string {
	k := e.Store + "/" + e.Path
	if e.Field != "" {
		k += "#" + e.Field
	}
	return k
}

// HeaderName is Header or the default.
func (e *EgressSecret) HeaderName() string {
	if e.Header == "" {
		return DefaultEgressSecretHeader
	}
	return e.Header
}

// EgressSecrets returns n's rules that carry a secret (nil n: none).
func (n *Network) EgressSecrets() []EgressRule {
	if n == nil {
		return nil
	}
	var out []EgressRule
	for _, e := range n.Egress {
		if e.Secret != nil {
			out = append(out, e)
		}
	}
	return out
}

// IngressRule allows traffic from one source to the sandbox's CUSTOM services. Exactly
// one of CIDR, Tenant and Any is set.
type IngressRule struct {
	CIDR   string      `json:"cidr,omitempty"`
	Except []string    `json:"except,omitempty"`
	Tenant string      `json:"tenant,omitempty"`
	Any    bool        `json:"any,omitempty"`
	Ports  []PortRange `json:"ports,omitempty"`
}

// PortRange is one port (EndPort 0) or the inclusive range Port..EndPort of a protocol.
type PortRange struct {
	// Protocol is "tcp", "udp" or "sctp"; "" means tcp, as in Kubernetes.
	Protocol string `json:"protocol,omitempty"`
	Port     int    `json:"port"`
	EndPort  int    `json:"end_port,omitempty"`
}

// DefaultEgress is the platform's egress when neither the sandbox nor its policy declares
// any: the internet and the sandboxes of the same organization.
func DefaultEgress() []EgressRule {
	return []EgressRule{{Any: true}, {Tenant: TenantSameOrg}}
}
