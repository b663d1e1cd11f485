package enroll

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// ArtifactFetcher downloads release binaries from the control plane
// (RunnerReleaseService) with the runner's certificate, for a runner that updates itself.
type ArtifactFetcher struct {
	hc     *http.Client
	client controlplanev1connect.RunnerReleaseServiceClient
	reg    controlplanev1connect.RunnerRegistrationServiceClient
}

// NewArtifactFetcher returns a fetcher over mTLS with id's certificate.
func NewArtifactFetcher(id *Identity) *ArtifactFetcher {
	host := id.ControlPlane
	if h, _, err := splitHost(host); err == nil {
		host = h
	}
	cert := id.Cert
	hc := httpClient(pki.ClientTLSConfig(&cert, id.CAs, host))
	return &ArtifactFetcher{hc: hc, client: controlplanev1connect.NewRunnerReleaseServiceClient(hc, "https://"+id.ControlPlane,
		connect.WithReadMaxBytes(1<<20)),
		reg: controlplanev1connect.NewRunnerRegistrationServiceClient(hc, "https://"+id.ControlPlane, connect.WithReadMaxBytes(1<<20))}
}

// Manifest returns version's signed release manifest and its signature as the control
// plane keeps them (RunnerRegistrationService.GetRelease); empty when the release was
// published without one. The caller verifies them: the control plane is only the relay.
func (f *ArtifactFetcher) Manifest(ctx context.Context, version string) (manifest, signature []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := f.reg.GetRelease(ctx, connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: version}))
	if err != nil {
		return nil, nil, fmt.Errorf("read release %s: %w", version, err)
	}
	return res.Msg.GetManifest(), res.Msg.GetManifestSignature(), nil
}

// Fetch streams version's binary name for arch into w; more than max bytes (as announced
// or as received) is an error, and so is a stream that stalls for a minute.
func (f *ArtifactFetcher) Fetch(ctx context.Context, version, arch, name string, w io.Writer, max int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := f.client.DownloadArtifact(ctx, connect.NewRequest(&controlplanev1.DownloadArtifactRequest{Version: version, Arch: arch, Name: name}))
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	// A stalled stream is cut: every message must come within a minute of the last.
	stall := time.AfterFunc(time.Minute, cancel)
	defer stall.Stop()
	var got, size int64
	first := true
	for s.Receive() {
		stall.Reset(time.Minute)
		m := s.Msg()
		if first {
			size, first = m.GetSize(), false
			if size < 0 || size > max {
				return fmt.Errorf("%s of %s is %d bytes; at most %d accepted", name, version, size, max)
			}
		}
		got += int64(len(m.GetChunk()))
		if got > size {
			return fmt.Errorf("%s of %s: more bytes than the %d announced", name, version, size)
		}
		if _, err := w.Write(m.GetChunk()); err != nil {
			return err
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	if first || got != size {
		return fmt.Errorf("%s of %s: %d bytes received of %d", name, version, got, size)
	}
	return nil
}

// Close releases the fetcher's connections.
func (f *ArtifactFetcher) Close() { f.hc.CloseIdleConnections() }
