package stack

import (
	"context"
	"errors"
	"fmt"
	"github.com/sandboxd/sandboxd/internal/egress"
	"io"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// images adapts the image store to what the local backend needs, translating its errors
// into the runtime's.
type images struct{ store *image.Store }

func (a images) Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*local.Image, error) {
	var c *image.Credentials
	if creds != nil {
		c = &image.Credentials{Username: creds.Username, Password: creds.Password}
	}
	img, err := a.store.Pull(ctx, ref, c)
	if err != nil {
		return nil, pullError(err)
	}
	cfg := img.Config
	return &local.Image{
		Ref:    img.Ref,
		Digest: img.Digest,
		Layers: img.Layers,
		Config: local.ImageConfig{Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User},
	}, nil
}

// WriteArchive writes ref's image as a docker-archive for a container engine
// (local.ImageArchiver), through the store's registry guard, credentials and mirrors.
func (a images) WriteArchive(ctx context.Context, ref string, creds *runtime.Credentials, w io.Writer, limit int64) error {
	var c *image.Credentials
	if creds != nil {
		c = &image.Credentials{Username: creds.Username, Password: creds.Password}
	}
	if err := a.store.WriteArchive(ctx, ref, c, w, limit); err != nil {
		return pullError(err)
	}
	return nil
}

var _ local.ImageArchiver = images{}

func pullError(err error) error {
	for _, m := range []struct{ from, to error }{
		{image.ErrNotFound, runtime.ErrImageNotFound},
		{image.ErrUnauthorized, runtime.ErrImageUnauthorized},
		{image.ErrUnreachable, runtime.ErrRegistry},
		{image.ErrInvalidReference, runtime.ErrInvalidImageRef},
		{image.ErrRegistryNotAllowed, runtime.ErrRegistryNotAllowed},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%w: %w", m.to, err)
		}
	}
	return err
}

// netAdapter adapts the network manager to the local backend.
type netAdapter struct{ m *network.Manager }

func (n netAdapter) Setup(ctx context.Context, id string) (*local.Attachment, error) {
	a, err := n.m.Setup(ctx, id)
	if err != nil {
		return nil, err
	}
	return toLocal(a), nil
}

func (n netAdapter) Lookup(id string) (*local.Attachment, error) {
	a, err := n.m.Lookup(id)
	if err != nil {
		return nil, err
	}
	return toLocal(a), nil
}

func (n netAdapter) Teardown(id string) error { return n.m.Teardown(id) }

// SetEgressSecrets hands the egress proxy a sandbox's secrets (local.EgressSecretsSetter).
func (n netAdapter) SetEgressSecrets(id string, ss *egress.SandboxSecrets) error {
	return n.m.SetEgressSecrets(id, ss)
}

func (n netAdapter) WriteEtcFiles(dir, hostname string, a *local.Attachment) error {
	return network.WriteEtcFiles(dir, hostname, &network.Attachment{
		ID: a.ID, NetNSPath: a.NetNSPath, IP: a.IP, Gateway: a.Gateway, PrefixLen: a.PrefixLen, HostVeth: a.HostVeth,
	}, n.m.Nameservers())
}

func toLocal(a *network.Attachment) *local.Attachment {
	return &local.Attachment{ID: a.ID, NetNSPath: a.NetNSPath, IP: a.IP, Gateway: a.Gateway, PrefixLen: a.PrefixLen, HostVeth: a.HostVeth}
}

func (n netAdapter) SetRules(id string, r local.Rules) error {
	conv := func(ps []local.Port) []network.Port {
		out := make([]network.Port, len(ps))
		for i, p := range ps {
			out[i] = network.Port{Proto: p.Proto, Port: p.Port}
		}
		return out
	}
	return n.m.SetRules(id, network.Rules{Org: r.Org, Caller: r.Caller, Private: conv(r.Private), Custom: conv(r.Custom), Network: r.Network})
}

// ReservedEgress: the local backend reports the network's reserved ranges to the runner.
func (n netAdapter) ReservedEgress() reserved.Set { return n.m.ReservedEgress() }

// The local backend asks its Network for the reserved ranges (local.Backend.ReservedEgress).
var _ runtime.EgressReserver = netAdapter{}

// BaseArchiver is the image store as runner.Local.BuildImages: base images of builds
// written as docker-archives through the store's registry guard, credentials, mirrors.
func (s *Stack) BaseArchiver() runner.BaseArchiver { return images{s.Images} }
