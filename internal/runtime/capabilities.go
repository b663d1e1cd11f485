package runtime

import "github.com/sandboxd/sandboxd/internal/reserved"

// NetworkSupport says which rules of a Network a backend enforces. The zero value
// enforces every rule; a backend that cannot implements NetworkSupporter, so that its
// runner refuses such sandboxes and the gateway places them elsewhere rather than run
// them with rules silently dropped.
type NetworkSupport struct {
	// NoDNSNames: egress rules by host name (EgressRule.DNSName) cannot be enforced,
	// e.g. Kubernetes NetworkPolicy matches addresses, never TLS server names.
	NoDNSNames bool
}

// NetworkSupporter is implemented by backends that do not enforce every network rule.
type NetworkSupporter interface {
	NetworkSupport() NetworkSupport
}

// EgressReserver is implemented by backends that keep address ranges out of every
// sandbox's egress whatever its rules ask (the platform's reserved ranges but those the
// runner's operator opened, the sandbox network, the host): the runner refuses at create
// a cidr rule that lies wholly inside them, and the backend cuts them out of the rest.
type EgressReserver interface {
	ReservedEgress() reserved.Set
}
