package local

import (
	"context"
	"net/netip"

	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Image is what the backend needs of a pulled image; it mirrors internal/image.Image so
// the backend can be tested (and driven) without a registry. internal/stack adapts the
// image store to Images.
type Image struct {
	Ref    string
	Digest string
	// Layers are unpacked layer directories, BOTTOM first.
	Layers []string
	Config ImageConfig
}

// ImageConfig is the part of the OCI image config a sandbox starts from.
type ImageConfig struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string
}

// Images pulls images. Errors should wrap runtime.ErrImageNotFound,
// ErrImageUnauthorized, ErrRegistry or ErrInvalidImageRef (internal/image's own
// sentinels are mapped too); anything else is reported wrapped in ErrRegistry.
type Images interface {
	Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error)
}

// Attachment is a sandbox's place on the host network; it mirrors network.Attachment.
type Attachment struct {
	ID, NetNSPath string
	IP, Gateway   netip.Addr
	PrefixLen     int
	HostVeth      string
}

// Network gives sandboxes their network namespaces; internal/stack adapts
// *network.Manager to it. A nil Network gives every sandbox a new, empty network
// namespace (loopback only).
type Network interface {
	Setup(ctx context.Context, id string) (*Attachment, error)
	Lookup(id string) (*Attachment, error)
	// Teardown is idempotent.
	Teardown(id string) error
	// WriteEtcFiles writes dir/hosts, dir/hostname and dir/resolv.conf for the sandbox.
	WriteEtcFiles(dir, hostname string, a *Attachment) error
	// SetRules applies the network rules of the sandbox whose attachment is id,
	// replacing earlier ones (Teardown removes them).
	SetRules(id string, r Rules) error
}

// ReservedEgress is what no sandbox's egress reaches: the Network's reserved ranges
// when it reports them (runtime.EgressReserver), else the platform's reserved ranges.
func (b *Backend) ReservedEgress() reserved.Set {
	if r, ok := b.cfg.Network.(runtime.EgressReserver); ok {
		return r.ReservedEgress()
	}
	return reserved.Default()
}

var _ runtime.EgressReserver = (*Backend)(nil)

// Rules are a sandbox's network rules; they mirror network.Rules.
type Rules struct {
	Org    string // the sandbox's organization
	Caller string // the API key that created it (tenant same_user)
	// Private ports are open to the organization's other sandboxes; Custom ports to the
	// sources Network.Ingress names.
	Private, Custom []Port
	// Network is the spec's; nil keeps the behaviour from before rules existed.
	Network *runtime.Network
}

// Port is a sandbox port that rules open.
type Port struct {
	Proto string // "tcp" or "udp"
	Port  uint16
}
