package runnerapi

import (
	"context"
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// fakeRunner's registered volumes: EnsureVolume answers 1 GiB for claim "ok" and
// CWSANDBOX_VOLUME_IN_USE on a delete of "busy" without force.
func (f *fakeRunner) EnsureVolume(_ context.Context, v runner.RegisteredVolume) (runner.VolumeState, error) {
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
