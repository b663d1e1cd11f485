package policy

import (
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// FuzzResolve drives Resolve with a random policy document and a spec built from a few
// knobs, and checks: no panic, the input is never modified, an accepted spec has a
// lifetime within 30 days, and resolving an accepted spec again accepts it unchanged.
func FuzzResolve(f *testing.F) {
	for _, seed := range []struct {
		policy                 string
		lifetime               int32
		cpu, mem, image, rc    string
		gpu                    int64
		services               uint8
		vis                    uint8
		annotation, egressCIDR string
		privileged             bool
	}{
		{`{}`, 0, "", "", "python:3.11", "", 0, 0, 0, "", "", false},
		{`{}`, MaxLifetimeSeconds + 1, "2", "1Gi", "ghcr.io/a/b@sha256:0123456789abcdef0123456789abcdef", "", 1, 6, 1, "k", "10.0.0.0/8", true},
		{`{"base": {"max_lifetime_seconds": 60, "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}, "env": {"A": "1"}, "tags": ["t"], "default_cpu_runtime_class": "gvisor", "default_gpu_runtime_class": "kata", "default_egress": [{"cidr": "10.0.0.0/8"}]},
		  "constraints": {"lifetime": {"max_seconds": 3600}, "resources": {"max_cpu": "2", "total_memory": "2Gi", "max_gpu": 1}, "security": {"allowed_runtime_classes": ["gvisor", "kata"]}, "network": {"allowed_egress": [{"cidr": "10.0.0.0/8"}, {"https_hostname": "*"}]}}}`,
			120, "500m", "", "python", "", 1, 1, 2, "x/y", "10.1.0.0/16", false},
		{`{"constraints": {"images": {"allowed_registries": ["docker.io"], "allowed_repositories": ["library/**"], "require_digest": true}, "services": {"max_services": 0}, "annotations": {"max_count": 0, "denied_prefixes": ["x/"]}}}`,
			-1, "1x", "-1Mi", "UPPER/Case:tag", "runc", -3, 3, 3, "x/z", "not-a-cidr", false},
		{`{"base": {"pause": {"lifetime": "HELD", "auto_resume": false, "idle_pause_seconds": 60}}, "constraints": {"lifetime": {"max_seconds": 120}}}`,
			0, "", "", "python", "", 0, 0, 0, "", "", false},
		{`{"base": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}, "constraints": {"network": {"allowed_egress": [{"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}]}}}`,
			0, "", "1.5Gi", "localhost:5000/x", "", 0, 0, 0, "", "192.168.0.0/16", false},
		{`{"control_plane_access": {"source_ip_allowlist": ["127.0.0.1", "10.0.0.0/8", "2001:db8::/32"]}}`,
			0, "", "", "python", "", 0, 0, 0, "", "10.1.2.3", false},
		{`{"control_plane_access": {"source_ip_allowlist": ["10.0.0.1/8", "::ffff:1.2.3.4", "fe80::1%lo", ""]}}`,
			0, "", "", "python", "", 0, 0, 0, "", "::ffff:10.1.2.3", false},
	} {
		f.Add(seed.policy, seed.lifetime, seed.cpu, seed.mem, seed.image, seed.rc, seed.gpu, seed.services, seed.vis, seed.annotation, seed.egressCIDR, seed.privileged)
	}
	f.Fuzz(func(t *testing.T, policyJSON string, lifetime int32, cpu, mem, image, rc string, gpu int64, services, vis uint8, annotation, egressCIDR string, privileged bool) {
		p, err := Parse([]byte(policyJSON))
		if err != nil {
			return
		}
		valid := len(Validate(p)) == 0
		if valid {
			checkPauseMeta(t, p)
		}
		checkSourceAllowed(t, p, valid, egressCIDR)
		s := &sandboxv1.SandboxSpec{
			MaxLifetimeSeconds: lifetime,
			RuntimeClass:       rc,
			Containers: []*sandboxv1.Container{{
				Name:  "main",
				Image: image,
				ResourceRequirements: &sandboxv1.ResourceRequirements{
					Limits: &sandboxv1.Resources{Cpu: cpu, Memory: mem, Gpu: &sandboxv1.Gpu{Count: gpu}},
				},
				SecurityContext: &sandboxv1.SecurityContext{Privileged: proto.Bool(privileged)},
			}},
		}
		if services%2 == 1 {
			s.Containers = append(s.Containers, &sandboxv1.Container{Name: "side", Image: image})
		}
		for i := range int(services % 8) {
			s.Services = append(s.Services, &sandboxv1.Service{Port: int32(1000 + i), Visibility: sandboxv1.Visibility(vis % 4)})
		}
		if annotation != "" {
			s.Annotations = map[string]string{annotation: "v"}
		}
		if egressCIDR != "" {
			s.Network = &sandboxv1.NetworkOptions{Egress: []*sandboxv1.EgressRule{{Destination: &sandboxv1.EgressRule_Cidr{Cidr: &sandboxv1.CidrBlock{Cidr: egressCIDR}}}}}
		}
		before := proto.CloneOf(s)
		got, vs := Resolve(p, s, DefaultPlatform())
		if !proto.Equal(before, s) {
			t.Fatal("Resolve modified its input")
		}
		if len(vs) > 0 {
			for _, v := range vs {
				if v.Field == "" || v.Constraint == "" || v.Description == "" {
					t.Fatalf("incomplete violation %+v", v)
				}
			}
			return
		}
		if lt := got.GetMaxLifetimeSeconds(); lt <= 0 || lt > MaxLifetimeSeconds {
			t.Fatalf("accepted lifetime %d", lt)
		}
		again, vs := Resolve(p, got, DefaultPlatform())
		if len(vs) > 0 {
			t.Fatalf("accepted spec rejected on a second resolution: %s", fmtVs(vs))
		}
		if !proto.Equal(got, again) {
			t.Fatalf("resolution not idempotent:\n%v\n%v", got, again)
		}
	})
}

// checkPauseMeta: a valid policy's pause settings resolve to Meta values the runner can
// read (the ones documented on runtime.MetaPauseLifetime, MetaAutoResume, MetaIdlePause).
func checkPauseMeta(t *testing.T, p *Policy) {
	t.Helper()
	for k, v := range pauseMeta(p.Base.Pause) {
		switch k {
		case runtime.MetaPauseLifetime:
			if v != "held" {
				t.Fatalf("%s = %q", k, v)
			}
		case runtime.MetaAutoResume:
			if v != "false" {
				t.Fatalf("%s = %q", k, v)
			}
		case runtime.MetaIdlePause:
			d, err := time.ParseDuration(v)
			if err != nil || d < MinIdlePauseSeconds*time.Second || d > time.Duration(MaxLifetimeSeconds)*time.Second {
				t.Fatalf("%s = %q (%v) in a valid policy", k, v, err)
			}
		default:
			t.Fatalf("unexpected Meta key %s", k)
		}
	}
}

// checkSourceAllowed: SourceAllowed never panics; without an allowlist it allows every
// caller, and in a valid policy an address is allowed exactly when an entry, parsed as
// netip parses it, contains it (addr is any string; one that is no address is the
// unknown caller, allowed only without an allowlist).
func checkSourceAllowed(t *testing.T, p *Policy, valid bool, addr string) {
	t.Helper()
	a, _ := netip.ParseAddr(addr)
	got := SourceAllowed(p, a)
	list := p.ControlPlaneAccess.SourceIPAllowlist
	if list == nil {
		if !got {
			t.Fatalf("no allowlist, but %q refused", addr)
		}
		return
	}
	if !a.IsValid() && got {
		t.Fatalf("unknown caller %q allowed by an allowlist", addr)
	}
	if !valid || !a.IsValid() {
		return
	}
	want := false
	for _, e := range list {
		pr, err := netip.ParsePrefix(e)
		if err != nil {
			ad := netip.MustParseAddr(e) // valid: an entry is a prefix or an address
			pr = netip.PrefixFrom(ad, ad.BitLen())
		}
		want = want || pr.Contains(a.Unmap().WithZone(""))
	}
	if got != want {
		t.Fatalf("%q against %v: allowed %v, want %v", addr, list, got, want)
	}
}
