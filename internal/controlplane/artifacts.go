package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"slices"
	"sync"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// ArtifactNames are the binaries a release directory may hold per version and
// architecture: the only names DownloadArtifact serves (never a caller's path).
var ArtifactNames = []string{"sandboxd", "sandbox-agent"}

// MaxArtifactBytes bounds one served binary (sandboxd is ~100 MB unstripped); a bigger
// file is refused rather than streamed.
const MaxArtifactBytes = 512 << 20

// artifactChunk is the most bytes one DownloadArtifactResponse carries.
const artifactChunk = 256 << 10

// Artifacts serves RunnerReleaseService: a published release's binaries from the release
// directory (--release-dir), laid out DIR/<version>/<goarch>/<name>, to registered runners.
type Artifacts struct{ s *Service }

// MaxDownloadsPerRunner bounds one runner's release downloads in flight.
const MaxDownloadsPerRunner = 2

// downloadSlots counts release downloads in flight per runner.
type downloadSlots struct {
	mu     sync.Mutex
	active map[string]int
}

func (d *downloadSlots) acquire(runner string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active[runner] >= MaxDownloadsPerRunner {
		return false
	}
	if d.active == nil {
		d.active = map[string]int{}
	}
	d.active[runner]++
	return true
}

func (d *downloadSlots) release(runner string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active[runner]--; d.active[runner] <= 0 {
		delete(d.active, runner)
	}
}

// Artifacts returns the RunnerReleaseService handler.
func (s *Service) Artifacts() *Artifacts { return &Artifacts{s: s} }

// ArtifactsHandler serves RunnerReleaseService over TLS (TLSConfig) so the handler sees
// the runner's verified client certificate.
func (s *Service) ArtifactsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(controlplanev1connect.NewRunnerReleaseServiceHandler(s.Artifacts(), connect.WithReadMaxBytes(4<<10)))
	return withTLSState(mux)
}

// DownloadArtifact streams one binary. The caller names it by version, architecture and
// name only, each checked against a fixed grammar or set; the file is opened through an
// os.Root on the release directory, so neither those strings nor a symbolic link in the
// directory can reach a file outside it. Only versions with a release record are served,
// and only to a runner of the control plane (client certificate, runner still recorded).
func (a *Artifacts) DownloadArtifact(ctx context.Context, req *connect.Request[controlplanev1.DownloadArtifactRequest], stream *connect.ServerStream[controlplanev1.DownloadArtifactResponse]) error {
	s := a.s
	org, id, err := caller(ctx)
	if err != nil {
		return err
	}
	if _, err := s.st.Runners().Get(ctx, org, id); err != nil {
		return runnerErr(id, "", err)
	}
	// A runner needs one binary at a time (two with the agent); more in flight would only
	// let one runner tie up the control plane's disk and bandwidth.
	if !s.downloads.acquire(org + "/" + id) {
		return apierr.New(apierr.ReleaseDownloadsBusy,
			fmt.Sprintf("runner %s already has %d release downloads in flight", id, MaxDownloadsPerRunner), nil)
	}
	defer s.downloads.release(org + "/" + id)
	v, arch, name := req.Msg.GetVersion(), req.Msg.GetArch(), req.Msg.GetName()
	var vs violations
	if _, err := release.ParseVersion(v); err != nil {
		vs.add("version", "%v", err)
	}
	if err := release.CheckArch(arch); err != nil {
		vs.add("arch", "%v", err)
	}
	if !slices.Contains(ArtifactNames, name) {
		vs.add("name", "must be one of %v, got %q", ArtifactNames, textclip.Clip(name, 64))
	}
	if err := vs.err("invalid artifact request"); err != nil {
		return err
	}
	if s.releaseDir == "" {
		return apierr.New(apierr.ReleaseArtifactsDisabled, "this control plane serves no release binaries (it runs without --release-dir)", nil)
	}
	if _, err := s.st.Releases().Get(ctx, v); err != nil {
		return releaseErr(v, err)
	}
	f, size, err := openArtifact(s.releaseDir, v, arch, name)
	if err != nil {
		s.log.Warn("release artifact not served", "runner", id, "version", v, "arch", arch, "name", name, "err", err)
		return apierr.New(apierr.ReleaseArtifactNotFound,
			fmt.Sprintf("the release directory has no %s for %s/%s", name, v, arch),
			map[string]string{"version": v, "arch": arch, "name": name})
	}
	defer f.Close()
	s.log.Info("release artifact download", "org", org, "runner", id, "version", v, "arch", arch, "name", name, "bytes", size)
	buf := make([]byte, artifactChunk)
	first := true
	r := io.LimitReader(f, size)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || first {
			msg := &controlplanev1.DownloadArtifactResponse{Chunk: buf[:n]}
			if first {
				msg.Size, first = size, false
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		switch {
		case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
			return nil
		case rerr != nil:
			return connect.NewError(connect.CodeInternal, fmt.Errorf("read %s %s/%s: %w", name, v, arch, rerr))
		}
	}
}

// openArtifact opens dir/<version>/<arch>/<name> inside dir only (os.Root: no "..", no
// symbolic link leading out), a regular file of at most MaxArtifactBytes.
func openArtifact(dir, version, arch, name string) (*os.File, int64, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = root.Close() }() // the file opened stays open
	f, err := root.Open(path.Join(version, arch, name))
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
	case !fi.Mode().IsRegular():
		err = fmt.Errorf("%s is not a regular file (%v)", f.Name(), fi.Mode().Type())
	case fi.Size() > MaxArtifactBytes:
		err = fmt.Errorf("%s has %d bytes, more than the %d served", f.Name(), fi.Size(), MaxArtifactBytes)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// desiredChecksums are the hex SHA-256s of the desired version's sandboxd and
// sandbox-agent for arch, from its release record ("" when unknown: no record, no
// such arch, or no desired version).
func (s *Service) desiredChecksums(ctx context.Context, desired, arch string) (sandboxd, agent string) {
	if desired == "" || release.CheckArch(arch) != nil {
		return "", ""
	}
	r, err := s.st.Releases().Get(ctx, desired)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("heartbeat: release record unreadable; no checksums sent", "version", desired, "err", err)
		}
		return "", ""
	}
	return r.BinaryChecksums[arch], agentChecksum(r, arch)
}

// agentChecksum is the release's sandbox-agent checksum for arch; "" when the release
// ships no agent for it (the runner then keeps its agent).
func agentChecksum(r store.Release, arch string) string { return r.AgentBinaryChecksums[arch] }
