package gateway

import (
	"context"
	"log/slog"

	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// Runner ownership (tenancy): a runner that belongs to an organization (a tenant's
// cluster or host, which the tenant controls) takes only that organization's sandboxes,
// forks, moves, templates (and their registry pull tokens), builds and volumes. The
// owner comes from what vouches for the runner, never from its own report: a remote
// runner's certificate, issued by the control plane at registration from its record
// (runner.OwnedHandle, pinned at the first handshake). A certificate naming the platform
// organization, or marked as a platform runner's (pki.PlatformRunnerURI: a runner
// holding the platform CA), and an in-process runner are the platform's: they serve
// every organization. A certificate naming no runner belongs to nobody (refused at the
// handshake: the runner stays unverified and takes nothing).

// runnerOwner is runner h's owner as placement sees it ("" = a platform runner), and
// whether it is known yet (until it is, the runner takes nothing).
func (s *Server) runnerOwner(h runner.Handle) (string, bool) {
	oh, ok := h.(runner.OwnedHandle)
	if !ok {
		return "", true
	}
	org, known := oh.Owner()
	if !known {
		return "", false
	}
	if org == s.platformOrg {
		return "", true
	}
	return org, true
}

// sameOwner reports whether runners a and b are known to have one owner (both the
// platform's, or both one organization's). A checkpoint moves or forks only between such
// runners: what an exporting runner writes (its manifest, the sandbox's bookkeeping, its
// volumes' names) is its own word, which a runner of another owner must not act on.
func (s *Server) sameOwner(a, b runner.Handle) bool {
	ao, aok := s.runnerOwner(a)
	bo, bok := s.runnerOwner(b)
	return aok && bok && ao == bo
}

// serves reports whether runner h may take work of organization org.
func (s *Server) serves(h runner.Handle, org string) bool {
	owner, known := s.runnerOwner(h)
	return known && placement.Serves(owner, org)
}

// servesLoaded is serves once the runners were probed (a gateway that just started knows
// no owner before).
func (s *Server) servesLoaded(ctx context.Context, h runner.Handle, org string) bool {
	s.views.ensureLoaded(ctx)
	return s.serves(h, org)
}

// warnNoPlatformOrg warns, loudly and once, of a gateway with remote runners
// (runner.OwnedHandle) and no platform organization: every runner registered through the
// control plane, the platform organization's own included, then serves only the
// organization its certificate names. It is a warning, not a refusal: it fails closed (no
// runner serves more organizations than it should), a runner holding the platform CA is
// the platform's without it (its certificate's explicit mark), and which remote runners
// are registered ones is known only at their handshakes, after New; sandboxd's dev and
// split modes always set it (the default organization).
func warnNoPlatformOrg(log *slog.Logger, platformOrg string, runners []runner.Handle) {
	if platformOrg != "" {
		return
	}
	var remote []string
	for _, h := range runners {
		if _, ok := h.(runner.OwnedHandle); ok {
			remote = append(remote, h.ID())
		}
	}
	if len(remote) == 0 {
		return
	}
	log.Warn("gateway: no platform organization (Config.PlatformOrg) and remote runners: a runner registered to any organization, the platform's included, will serve only that organization; set the platform organization",
		"remote_runners", remote)
}
