package runnerapi

import (
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// notOnTheWire are the parts of a create request the runner wire does not carry (by
// path, as runtimetest names them), and why. Each is a gap to close with a wire field,
// never a place to park a new field.
var notOnTheWire = map[string]string{
	"Spec.Container.Resources.DiskBytes": "no public field sets it and sandboxd.runner.v1 Resources has no field for it: " +
		"a remote runner's backend applies its own default (local and kubernetes Config.DiskBytes)",
	"Spec.Sidecars[].Resources.DiskBytes":       "as Spec.Container.Resources.DiskBytes",
	"Spec.InitContainers[].Resources.DiskBytes": "as Spec.Container.Resources.DiskBytes",
	"Spec.Volumes[].RestoreDigest": "the runner sets it itself from CreateRequest.Restores (Volume.restore on the wire) " +
		"and clears a caller's: the backend restores from whatever archive it names",
	"Spec.Volumes[].Keep": "only the runner's own image builds set it (Runner.create's keep, unexported); Create clears a caller's: " +
		"a kept volume outlives its sandbox and is another sandbox's (an organization's layer cache)",
}

// notInSnapshots are the parts of a runtime.Spec that sandboxToProto leaves out of the
// sandboxes a runner reports (by path, as runtimetest names them), and why.
var notInSnapshots = map[string]string{
	"Container.PullCredentials":        "a secret for one pull: never sent back once the sandbox exists",
	"Sidecars[].PullCredentials":       "as Container.PullCredentials",
	"InitContainers[].PullCredentials": "as Container.PullCredentials",
	"Container.SecretEnv":              "secret values for one start: never sent back (docs/secrets.md)",
	"Sidecars[].SecretEnv":             "as Container.SecretEnv",
	"InitContainers[].SecretEnv":       "as Container.SecretEnv",
	"Engine.PullCredentials":           "as Container.PullCredentials",
	"EgressSecretValues":               "egress secret values for the egress proxy: never sent back (docs/secrets.md)",
}

// TestSpecWireRoundTrip, in the manner of Tailscale's ipn/prefs_test.go: a create request
// with every field of its runtime.Spec set, recursively, survives the runner wire
// (specToProto, specFromProto) unchanged; a field added to runtime.Spec (or to what it
// holds) that the wire does not carry fails here with its path. The wire is internal to
// sandboxd, so it carries everything but the gaps notOnTheWire lists: the gateway and
// the runner must agree on the spec the backend runs.
func TestSpecWireRoundTrip(t *testing.T) {
	var req runner.CreateRequest
	runtimetest.FillAll(t, reflect.ValueOf(&req).Elem(), "")
	got := createFromProto(createToProto(req))
	lost := map[string]bool{}
	for _, p := range runtimetest.Diff(reflect.ValueOf(got), reflect.ValueOf(req), "") {
		lost[p] = true
		if _, ok := notOnTheWire[p]; !ok {
			t.Errorf("%s does not survive the runner wire (createToProto, createFromProto): map it in specToProto and specFromProto", p)
		}
	}
	for p := range notOnTheWire {
		if !lost[p] {
			t.Errorf("notOnTheWire lists %s, which the wire carries: delete the entry", p)
		}
	}

	// A sandbox's spec comes back the same but for what snapshots leave out on purpose.
	sb := runner.Sandbox{Spec: req.Spec}
	back := sandboxFromProto(sandboxToProto(sb))
	differs := map[string]bool{}
	for _, p := range runtimetest.Diff(reflect.ValueOf(back.Spec), reflect.ValueOf(sb.Spec), "") {
		differs[p] = true
		if _, ok := notInSnapshots[p]; !ok && !lost["Spec."+p] {
			t.Errorf("Spec.%s does not survive the runner wire in a sandbox (sandboxToProto, sandboxFromProto)", p)
		}
	}
	for p := range notInSnapshots {
		if !differs[p] {
			t.Errorf("notInSnapshots lists Spec.%s, which a sandbox's spec does carry: delete the entry", p)
		}
	}
}

// TestContainerStatusesWireRoundTrip: every field of a sandbox's container statuses
// survives the runner wire, and a zero exit code stays a real one.
func TestContainerStatusesWireRoundTrip(t *testing.T) {
	var sb runner.Sandbox
	runtimetest.FillAll(t, reflect.ValueOf(&sb.Containers).Elem(), "Containers")
	back := sandboxFromProto(sandboxToProto(sb))
	for _, p := range runtimetest.Diff(reflect.ValueOf(back.Containers), reflect.ValueOf(sb.Containers), "Containers") {
		t.Errorf("%s does not survive the runner wire (sandboxToProto, sandboxFromProto)", p)
	}
	zero := int32(0)
	sb.Containers[0].ExitCode = &zero
	if back := sandboxFromProto(sandboxToProto(sb)); back.Containers[0].ExitCode == nil || *back.Containers[0].ExitCode != 0 {
		t.Fatalf("exit code 0 lost: %+v", back.Containers[0])
	}
	if back := sandboxFromProto(sandboxToProto(runner.Sandbox{})); back.Containers != nil {
		t.Fatalf("a single-container sandbox came back with containers %+v", back.Containers)
	}
}
