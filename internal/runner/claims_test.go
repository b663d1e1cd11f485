package runner

import (
	"context"
	"fmt"
	"testing"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// claimFake is a fake backend whose registered volumes are claims in namespace "sbx",
// and which takes SecretRefs (granting only secret "ok").
type claimFake struct {
	*runtimetest.Fake
	got     []runtime.Claim
	removed []runtime.Claim
	// sizes are the existing claims' sizes (ClaimSize); nil: not a ClaimSizer's answer
	// (sizedClaimFake adds the method).
	sizes map[string]int64
}

// sizedClaimFake is a claimFake that tells existing claims' sizes (runtime.ClaimSizer).
type sizedClaimFake struct{ *claimFake }

func (f sizedClaimFake) ClaimSize(_ context.Context, c runtime.Claim) (int64, error) {
	return f.sizes[c.Name], nil
}

func (f *claimFake) ClaimNamespace() string { return "sbx" }
func (f *claimFake) EnsureClaim(_ context.Context, c runtime.Claim) (runtime.ClaimState, error) {
	if c.Name == "foreign" {
		return runtime.ClaimState{}, fmt.Errorf("%w: not granted", runtime.ErrClaimIneligible)
	}
	f.got = append(f.got, c)
	return runtime.ClaimState{CapacityBytes: 5 << 30, AccessModes: []string{"ReadWriteOnce"}}, nil
}
func (f *claimFake) RemoveClaim(_ context.Context, c runtime.Claim) error {
	f.removed = append(f.removed, c)
	return nil
}
func (f *claimFake) CheckSecretRefs(_ context.Context, spec *runtime.Spec) error {
	for _, c := range spec.AllContainers() {
		for _, r := range c.SecretRefs {
			if r.Secret != "ok" {
				return fmt.Errorf("%w: store %q, path %q", runtime.ErrSecretRefNotGranted, r.Store, r.Secret)
			}
		}
	}
	return nil
}

// TestClaimVolumesOnTheRunner: on a backend of claims the namespace must be the backend's
// (a field violation otherwise), the policy's storage classes reach the backend, and an
// ineligible claim is CWSANDBOX_VOLUME_RUNNER_INELIGIBLE naming claim_name.
func TestClaimVolumesOnTheRunner(t *testing.T) {
	f := &claimFake{Fake: runtimetest.NewFake()}
	t.Cleanup(f.Close)
	l := engineRunner(t, f, "")
	ctx := context.Background()
	v := RegisteredVolume{Org: "acme", ClaimName: "data", Namespace: "sbx", StorageClass: "fast", AllowedStorageClasses: []string{"fast"}}
	if n, err := l.EnsureVolume(ctx, v); err != nil || n.CapacityBytes != 5<<30 || len(n.AccessModes) != 1 || n.AccessModes[0] != "ReadWriteOnce" {
		t.Fatalf("ensure: %+v %v", n, err)
	}
	if c := f.got[0]; c.Managed != v.ManagedName() || c.StorageClass != "fast" || len(c.AllowedStorageClasses) != 1 || c.Org != "acme" {
		t.Errorf("claim %+v", c)
	}
	for ns, field := range map[string]string{"default": "volume.spec.pvc.namespace", "other": "volume.spec.pvc.namespace"} {
		bad := v
		bad.Namespace = ns
		_, err := l.EnsureVolume(ctx, bad)
		if vs := apierr.Violations(err); apierr.Reason(err) != apierr.VolumeRunnerIneligible || len(vs) != 1 || vs[0].Field != field {
			t.Errorf("namespace %s: %v %+v", ns, err, vs)
		}
	}
	foreign := v
	foreign.ClaimName = "foreign"
	_, err := l.EnsureVolume(ctx, foreign)
	if vs := apierr.Violations(err); apierr.Reason(err) != apierr.VolumeRunnerIneligible || len(vs) != 1 || vs[0].Field != "volume.spec.pvc.claim_name" {
		t.Errorf("foreign claim: %v %+v", err, vs)
	}
	if err := l.DeleteVolume(ctx, v, false); err != nil || len(f.removed) != 1 {
		t.Errorf("delete: %v %v", err, f.removed)
	}
}

// TestSecretRefsOnTheRunner: a backend that takes SecretRefs checks them before anything
// is made (CWSANDBOX_SECRET_NOT_PROVISIONED); one that does not refuses them with the
// reason.
func TestSecretRefsOnTheRunner(t *testing.T) {
	ctx := context.Background()
	spec := func(secret string) runtime.Spec {
		s := runtime.Spec{Container: runtime.Container{Image: "busybox", Command: "sleep"}}
		s.SecretRefs = []runtime.SecretRef{{EnvVar: "TOKEN", Store: "kube", Secret: secret, Key: "token"}}
		return s
	}
	f := &claimFake{Fake: runtimetest.NewFake()}
	t.Cleanup(f.Close)
	l := engineRunner(t, f, "")
	if _, err := l.Create(ctx, CreateRequest{Spec: spec("ok")}); err != nil {
		t.Fatalf("granted: %v", err)
	}
	if _, err := l.Create(ctx, CreateRequest{Spec: spec("runner-own")}); apierr.Reason(err) != apierr.SecretNotProvisioned {
		t.Errorf("not granted: %v", err)
	}
	bad := spec("ok")
	bad.SecretRefs[0].EnvVar = "1BAD"
	if _, err := l.Create(ctx, CreateRequest{Spec: bad}); apierr.Reason(err) != apierr.InvalidRequest {
		t.Errorf("bad env var: %v", err)
	}
	plain := runtimetest.NewFake()
	t.Cleanup(plain.Close)
	lp := engineRunner(t, plain, "")
	if _, err := lp.Create(ctx, CreateRequest{Spec: spec("ok")}); apierr.Reason(err) != apierr.SecretStoreProviderUnsupported {
		t.Errorf("local runner: %v", err)
	}
}

// TestSupportSecretRefs: a runner whose backend checks KUBERNETES secret references
// (runtime.SecretRefChecker) says it reads them; any other says it does not, so the
// gateway places such sandboxes elsewhere.
func TestSupportSecretRefs(t *testing.T) {
	f := &claimFake{Fake: runtimetest.NewFake()}
	t.Cleanup(f.Close)
	if engineRunner(t, f, "").R.Support().NoSecretRefs {
		t.Error("a backend that checks secret references: NoSecretRefs")
	}
	plain := runtimetest.NewFake()
	t.Cleanup(plain.Close)
	if !engineRunner(t, plain, "").R.Support().NoSecretRefs {
		t.Error("a backend that cannot read secret references: not NoSecretRefs")
	}
}

// TestClaimPolicySize: a claim above the runner's policy bound is refused before the
// backend makes anything; one that already exists at that size (the policy lowered since)
// is adopted, on a backend that tells claims' sizes; asked larger than it is, it is
// refused again.
func TestClaimPolicySize(t *testing.T) {
	f := sizedClaimFake{&claimFake{Fake: runtimetest.NewFake(), sizes: map[string]int64{"old": 2 << 30}}}
	t.Cleanup(f.Close)
	l := engineRunner(t, f, "")
	ctx := context.Background()
	v := RegisteredVolume{Org: "acme", ClaimName: "new", Namespace: "sbx", SizeBytes: 2 << 30, MaxSizeBytes: 1 << 30}
	if _, err := l.EnsureVolume(ctx, v); apierr.Reason(err) != apierr.PlacementRejected || len(f.got) != 0 {
		t.Fatalf("a new claim above the bound = %v (backend asked %d times)", err, len(f.got))
	}
	v.ClaimName = "old"
	if _, err := l.EnsureVolume(ctx, v); err != nil || len(f.got) != 1 || f.got[0].Name != "old" {
		t.Fatalf("an existing claim at its size, above the lowered bound = %v (%+v)", err, f.got)
	}
	v.SizeBytes = 3 << 30
	if _, err := l.EnsureVolume(ctx, v); apierr.Reason(err) != apierr.PlacementRejected || len(f.got) != 1 {
		t.Fatalf("an existing claim asked larger than it is, above the bound = %v", err)
	}
}
