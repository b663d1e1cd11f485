package placement

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/policy"
)

// TestPlaceGlobalVolumes: a sandbox mounting GLOBAL volumes goes only to runners that
// mount them (no Support.NoGlobalVolumes); with none among the runners considered it is
// refused as FAILED_PRECONDITION CWSANDBOX_NO_SUITABLE_RUNNER with a violation per runner
// and GLOBAL volume naming ConstraintGlobalVolumes. A sandbox mounting none goes anywhere.
func TestPlaceGlobalVolumes(t *testing.T) {
	local := rn("local", nil)
	kube := rn("kube", nil)
	kube.NoGlobalVolumes = true
	noBlobs := rn("no-blobs", nil)
	noBlobs.NoGlobalVolumes = true
	fields := []string{"sandbox.spec.volumes[0].volume_id", "sandbox.spec.volumes[2].volume_id"}

	for range 20 { // ties are random: the capable runner must win every time
		cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{kube, local, noBlobs}, Platform: policy.RunnerPlatform(nil),
			GlobalVolumeFields: fields})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(cands); len(got) != 1 || got[0] != "local" {
			t.Fatalf("candidates %v, want only the runner that mounts GLOBAL volumes", got)
		}
	}
	// Without GLOBAL volumes every runner is a candidate.
	cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{kube, local, noBlobs}, Platform: policy.RunnerPlatform(nil)})
	if err != nil || len(cands) != 3 {
		t.Fatalf("without GLOBAL volumes: %v, %v; want all three runners", ids(cands), err)
	}

	for _, runners := range [][]Runner{{kube, noBlobs}, {kube}} {
		before := counters.Values()
		_, err := Place(Request{Spec: spec("1", "1Gi"), Runners: runners, Platform: policy.RunnerPlatform(nil), GlobalVolumeFields: fields})
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
			t.Fatalf("%d incapable runners: err = %v, want FAILED_PRECONDITION %s", len(runners), err, apierr.NoSuitableRunner)
		}
		if !strings.Contains(err.Error(), ConstraintGlobalVolumes) {
			t.Errorf("message %q does not name %s", err.Error(), ConstraintGlobalVolumes)
		}
		if vs := apierr.Violations(err); len(vs) != len(runners)*len(fields) {
			t.Errorf("violations %v, want one per runner and GLOBAL volume", vs)
		}
		for _, r := range runners {
			for _, f := range fields {
				if !hasField(err, "runner["+r.ID+"]."+f, ConstraintGlobalVolumes) {
					t.Errorf("violations %v, want runner[%s].%s naming %s", apierr.Violations(err), r.ID, f, ConstraintGlobalVolumes)
				}
			}
		}
		k := `cwsandbox_placement_rejections_total{constraint="` + ConstraintGlobalVolumes + `"}`
		if got := counters.Values()[k] - before[k]; got != float64(len(runners)) {
			t.Errorf("%s grew by %v, want %d", k, got, len(runners))
		}
	}

	// A runner pinned by runner_ids that cannot mount them: refused the same way.
	_, err = Place(Request{Spec: spec("1", "1Gi", "kube"), Runners: []Runner{kube, local}, Platform: policy.RunnerPlatform(nil), GlobalVolumeFields: fields[:1]})
	if apierr.Reason(err) != apierr.NoSuitableRunner || !hasField(err, "runner[kube]."+fields[0], ConstraintGlobalVolumes) {
		t.Errorf("pinned to the Kubernetes runner: %v (%v), want %s naming %s", err, apierr.Violations(err), apierr.NoSuitableRunner, ConstraintGlobalVolumes)
	}
}

// TestPlaceGlobalVolumeWriters: a runner that mounts GLOBAL volumes read-only only
// (Support.NoGlobalVolumeWriters: a Kubernetes runner) takes a sandbox whose GLOBAL
// mounts are all read-only, and not one mounting one read-write (its copy must be
// committed): that goes to a runner that commits it, or is refused naming
// ConstraintGlobalVolumeWriters on the read-write volume's field only.
func TestPlaceGlobalVolumeWriters(t *testing.T) {
	local := rn("local", nil)
	kube := rn("kube", nil)
	kube.NoGlobalVolumeWriters = true
	fields := []string{"sandbox.spec.volumes[0].volume_id", "sandbox.spec.volumes[2].volume_id"}
	writers := fields[1:]

	// Read-only mounts only: both runners.
	cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{kube, local}, Platform: policy.RunnerPlatform(nil), GlobalVolumeFields: fields})
	if err != nil || len(cands) != 2 {
		t.Fatalf("read-only GLOBAL mounts: %v, %v; want both runners", ids(cands), err)
	}
	for range 20 { // ties are random
		cands, err := Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{kube, local}, Platform: policy.RunnerPlatform(nil),
			GlobalVolumeFields: fields, GlobalWriterFields: writers})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(cands); len(got) != 1 || got[0] != "local" {
			t.Fatalf("a read-write GLOBAL mount: candidates %v, want only the runner that commits it", got)
		}
	}
	before := counters.Values()
	_, err = Place(Request{Spec: spec("1", "1Gi"), Runners: []Runner{kube}, Platform: policy.RunnerPlatform(nil), GlobalVolumeFields: fields, GlobalWriterFields: writers})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("only the read-only runner: %v, want FAILED_PRECONDITION %s", err, apierr.NoSuitableRunner)
	}
	if vs := apierr.Violations(err); len(vs) != 1 || !hasField(err, "runner[kube]."+writers[0], ConstraintGlobalVolumeWriters) {
		t.Errorf("violations %v, want one on runner[kube].%s naming %s", vs, writers[0], ConstraintGlobalVolumeWriters)
	}
	k := `cwsandbox_placement_rejections_total{constraint="` + ConstraintGlobalVolumeWriters + `"}`
	if got := counters.Values()[k] - before[k]; got != 1 {
		t.Errorf("%s grew by %v, want 1", k, got)
	}
}
