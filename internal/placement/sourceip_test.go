package placement

import (
	"net/netip"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// TestPlaceSourceIP: a runner whose allowlist excludes the caller is no candidate; when
// every runner excludes it the error is PERMISSION_DENIED naming the address, and among
// other refusals its violation names the constraint; the platform's own placements
// (CheckSource false) are not limited.
func TestPlaceSourceIP(t *testing.T) {
	only1 := mustPolicy(t, `{"control_plane_access": {"source_ip_allowlist": ["192.0.2.1"]}}`)
	none := mustPolicy(t, `{"control_plane_access": {"source_ip_allowlist": []}}`)
	strict := mustPolicy(t, `{"constraints": {"images": {"allowed_registries": ["ghcr.io"]}}}`)
	caller := netip.MustParseAddr("198.51.100.7")

	cands, err := Place(Request{Spec: spec("", ""), Runners: []Runner{rn("a", only1), rn("b", nil)}, CheckSource: true, Source: caller})
	if err != nil || len(cands) != 1 || cands[0].RunnerID != "b" {
		t.Fatalf("candidates %v, %v; want b only", ids(cands), err)
	}
	if cands, err := Place(Request{Spec: spec("", ""), Runners: []Runner{rn("a", only1)}, CheckSource: true, Source: netip.MustParseAddr("192.0.2.1")}); err != nil || len(cands) != 1 {
		t.Fatalf("allowed caller: %v %v", ids(cands), err)
	}
	if cands, err := Place(Request{Spec: spec("", ""), Runners: []Runner{rn("a", none)}}); err != nil || len(cands) != 1 {
		t.Fatalf("the platform's own placement is limited: %v %v", ids(cands), err)
	}

	_, err = Place(Request{Spec: spec("", ""), Runners: []Runner{rn("a", only1), rn("b", none)}, CheckSource: true, Source: caller})
	if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.SourceIPNotAllowed ||
		apierr.Info(err).GetMetadata()["source_ip"] != "198.51.100.7" || len(apierr.Violations(err)) != 2 {
		t.Fatalf("every runner refuses the caller: %v (%v)", err, apierr.Violations(err))
	}
	_, err = Place(Request{Spec: spec("", ""), Runners: []Runner{rn("a", only1)}, CheckSource: true}) // unknown caller
	if apierr.Reason(err) != apierr.SourceIPNotAllowed || apierr.Info(err).GetMetadata()["source_ip"] != "an unknown address" {
		t.Fatalf("unknown caller: %v", err)
	}

	_, err = Place(Request{Spec: spec("", ""), Runners: []Runner{rn("a", only1), rn("b", strict)}, CheckSource: true, Source: caller})
	if apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("mixed refusals: %v", err)
	}
	found := false
	for _, v := range apierr.Violations(err) {
		found = found || v.Field == "runner[a].control_plane_access.source_ip_allowlist"
	}
	if !found {
		t.Errorf("mixed refusals do not name the allowlist: %v", apierr.Violations(err))
	}
}
