package runnerapi

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// fakeRunner's registered volumes: EnsureVolume answers 1 GiB for claim "ok" and
// CWSANDBOX_VOLUME_IN_USE on a delete of "busy" without force.
func (f *fakeRunner) EnsureVolume(_ context.Context, v runner.RegisteredVolume) (runner.VolumeState, error) {
	f.mu.Lock()
	f.ensured = v
	f.mu.Unlock()
	if v.ClaimName != "ok" || v.Org != "acme" || v.Namespace != "default" {
		return runner.VolumeState{}, apierr.Newf(apierr.VolumeTypeNotSupported, "no %+v", v)
	}
	return runner.VolumeState{CapacityBytes: 1 << 30, AccessModes: []string{"ReadWriteOncePod"}}, nil
}

func (f *fakeRunner) DeleteVolume(_ context.Context, v runner.RegisteredVolume, force bool) error {
	if v.ClaimName == "busy" && !force {
		return apierr.Newf(apierr.VolumeInUse, "busy")
	}
	return nil
}

// TestVolumeRPCs: EnsureVolume and DeleteVolume cross the wire with their fields and
// their errors' reasons.
func TestVolumeRPCs(t *testing.T) {
	tr := startRunner(t, &fakeRunner{})
	c := tr.client(t)
	ctx := context.Background()
	n, err := c.EnsureVolume(ctx, runner.RegisteredVolume{Org: "acme", ClaimName: "ok", Namespace: "default"})
	if err != nil || n.CapacityBytes != 1<<30 || len(n.AccessModes) != 1 || n.AccessModes[0] != "ReadWriteOncePod" {
		t.Fatalf("ensure = %+v, %v", n, err)
	}
	if _, err := c.EnsureVolume(ctx, runner.RegisteredVolume{Org: "acme", ClaimName: "nope", Namespace: "default"}); apierr.Reason(err) != apierr.VolumeTypeNotSupported {
		t.Fatalf("ensure unsupported = %v", err)
	}
	if err := c.DeleteVolume(ctx, runner.RegisteredVolume{Org: "acme", ClaimName: "busy", Namespace: "default"}, false); apierr.Reason(err) != apierr.VolumeInUse {
		t.Fatalf("delete busy = %v", err)
	}
	if err := c.DeleteVolume(ctx, runner.RegisteredVolume{Org: "acme", ClaimName: "busy", Namespace: "default"}, true); err != nil {
		t.Fatalf("delete forced = %v", err)
	}
}

// TestCapacitySecretRefsOverTheWire: whether a runner reads KUBERNETES secret store
// references reaches the gateway; an older runner that says nothing is taken not to.
func TestCapacitySecretRefsOverTheWire(t *testing.T) {
	if capacityFromProto(capacityToProto(runner.Capacity{})).NoSecretRefs {
		t.Fatal("a runner that reads secret references lost it on the wire")
	}
	if !capacityFromProto(capacityToProto(runner.Capacity{Support: runtime.Support{NoSecretRefs: true}})).NoSecretRefs {
		t.Fatal("a runner that reads none said it does on the wire")
	}
	if !capacityFromProto(nil).NoSecretRefs {
		t.Fatal("a runner that says nothing reads secret references")
	}
}

// TestVolumeSizeBoundFromTheRunnersPolicy: the runner API server fills a registered
// volume's size bound from the runner's own policy (constraints.volumes.max_size), never
// from its caller, so runner.Runner.EnsureVolume refuses a larger one whatever the
// gateway checked; without a bound in the policy there is none.
func TestVolumeSizeBoundFromTheRunnersPolicy(t *testing.T) {
	fake := &fakeRunner{}
	req := func() *connect.Request[runnerv1.EnsureVolumeRequest] {
		return connect.NewRequest(&runnerv1.EnsureVolumeRequest{Volume: &runnerv1.RegisteredVolume{OrganizationId: "acme", ClaimName: "ok", Namespace: "default", SizeBytes: 2 << 30}})
	}
	bounded := newServer(fake, nil, nil).WithPolicy("r1", staticPolicy(`{"constraints": {"volumes": {"max_size": "1Gi"}}}`))
	if _, err := bounded.EnsureVolume(context.Background(), req()); err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	got := fake.ensured
	fake.mu.Unlock()
	if got.MaxSizeBytes != 1<<30 || got.SizeBytes != 2<<30 {
		t.Fatalf("the runner got %+v", got)
	}
	if _, err := newServer(fake, nil, nil).WithPolicy("r1", staticPolicy(`{}`)).EnsureVolume(context.Background(), req()); err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.ensured.MaxSizeBytes != 0 {
		t.Fatalf("no bound in the policy, yet %d", fake.ensured.MaxSizeBytes)
	}
}

// TestCapacityGlobalVolumesOverTheWire: whether a runner mounts GLOBAL volumes reaches the
// gateway; an older runner that says nothing is taken to (as before the field: GLOBAL
// sandboxes keep being placed on it through an upgrade of the gateway).
func TestCapacityGlobalVolumesOverTheWire(t *testing.T) {
	if capacityFromProto(capacityToProto(runner.Capacity{})).NoGlobalVolumes {
		t.Fatal("a runner that mounts GLOBAL volumes lost it on the wire")
	}
	if capacityToProto(runner.Capacity{}).GetNoGlobalVolumes() {
		t.Fatal("a runner that mounts GLOBAL volumes says it does not on the wire")
	}
	if !capacityFromProto(capacityToProto(runner.Capacity{Support: runtime.Support{NoGlobalVolumes: true}})).NoGlobalVolumes {
		t.Fatal("a runner that mounts none said it does on the wire")
	}
	if capacityFromProto(&runnerv1.CapacityResponse{MilliCpu: 4000, SecretRefs: true, Snapshots: true}).NoGlobalVolumes {
		t.Fatal("an older runner that says nothing of GLOBAL volumes is taken not to mount them")
	}
	// Read-only only (a Kubernetes runner): said and kept; an older runner, which says
	// nothing, is taken to commit a writer's copy (or refuse it at create).
	ro := capacityFromProto(capacityToProto(runner.Capacity{Support: runtime.Support{NoGlobalVolumeWriters: true}}))
	if ro.NoGlobalVolumes || !ro.NoGlobalVolumeWriters {
		t.Fatalf("a read-only GLOBAL runner came over the wire as %+v", ro.Support)
	}
	if capacityFromProto(capacityToProto(runner.Capacity{})).NoGlobalVolumeWriters ||
		capacityFromProto(&runnerv1.CapacityResponse{MilliCpu: 4000}).NoGlobalVolumeWriters {
		t.Fatal("a runner that commits GLOBAL writers (or says nothing) is taken not to")
	}
}
