package runnerapi

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
)

// The runner's own policy check sees the network rules and services it is asked to
// enforce, and does not fill in defaults the gateway already resolved.
func TestSpecForPolicyNetwork(t *testing.T) {
	envelope, err := policy.Parse([]byte(`{"constraints": {
		"network": {"allowed_egress": [{"cidr": "10.0.0.0/8"}, {"tenant": "SAME_ORG"}], "allowed_ingress": [{"tenant": "SAME_ORG"}]},
		"services": {"allowed_visibilities": ["PRIVATE"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req := func(n *runtime.Network, svcs ...runtime.Service) runner.CreateRequest {
		return runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}, Network: n, Services: svcs}, Lifetime: time.Minute}
	}
	for _, tc := range []struct {
		name   string
		req    runner.CreateRequest
		fields []string
	}{
		{"inside the envelope", req(&runtime.Network{Egress: []runtime.EgressRule{{CIDR: "10.1.0.0/16"}, {Tenant: runtime.TenantSameOrg}}}), nil},
		{"outside it", req(&runtime.Network{Egress: []runtime.EgressRule{{CIDR: "10.0.0.0/8"}, {Any: true}, {DNSName: "pypi.org"}},
			Ingress: []runtime.IngressRule{{Any: true}}}),
			[]string{"sandbox.spec.network.egress[1]", "sandbox.spec.network.egress[2]", "sandbox.spec.network.ingress[0]"}},
		// Resolved to no egress by the gateway: the platform default is not added again.
		{"resolved to nothing", req(&runtime.Network{}), nil},
		{"deny", req(&runtime.Network{DenyEgress: true}), nil},
		{"a spec recorded before rules", req(nil), nil},
		{"custom service", req(&runtime.Network{}, runtime.Service{Port: 9000, Visibility: "custom"}), []string{"sandbox.spec.services[0].visibility"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, vs := policy.Resolve(envelope, spec.ForPolicy(tc.req), policy.RunnerPlatform(nil))
			var got []string
			for _, v := range vs {
				got = append(got, v.Field)
			}
			if len(got) != len(tc.fields) {
				t.Fatalf("violations %v, want %v", got, tc.fields)
			}
			for i := range got {
				if got[i] != tc.fields[i] {
					t.Errorf("violation %d on %s, want %s", i, got[i], tc.fields[i])
				}
			}
		})
	}
}

// The runner's own policy check sees requests as well as limits: a max_cpu holds both.
func TestSpecForPolicyResources(t *testing.T) {
	strict, err := policy.Parse([]byte(`{"constraints": {"resources": {"max_cpu": "1", "max_memory": "1Gi"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	res := func(r runtime.Resources) runner.CreateRequest {
		return runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox", Resources: r}}, Lifetime: time.Minute}
	}
	for _, tc := range []struct {
		name   string
		req    runner.CreateRequest
		fields []string
	}{
		{"within", res(runtime.Resources{RequestMilliCPU: 100, MilliCPU: 1000, RequestMemoryBytes: 128 << 20, MemoryBytes: 1 << 30}), nil},
		{"request above max", res(runtime.Resources{RequestMilliCPU: 2000, MilliCPU: 4000, MemoryBytes: 1 << 30}),
			[]string{"sandbox.spec.containers[0].resource_requirements.requests.cpu", "sandbox.spec.containers[0].resource_requirements.limits.cpu"}},
		{"a lone limit is checked once", res(runtime.Resources{MilliCPU: 2000, MemoryBytes: 1 << 30}),
			[]string{"sandbox.spec.containers[0].resource_requirements.limits.cpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, vs := policy.Resolve(strict, spec.ForPolicy(tc.req), policy.RunnerPlatform(nil))
			var got []string
			for _, v := range vs {
				got = append(got, v.Field)
			}
			if !reflect.DeepEqual(got, tc.fields) {
				t.Errorf("violations %v, want %v", got, tc.fields)
			}
		})
	}
}

type staticPolicy string

func (p staticPolicy) Policy(context.Context, string) ([]byte, int64, error) {
	return []byte(p), 7, nil
}

// The Pod settings that crossed the wire are what an unregistered runner (no policy of
// its own) applies; a runner with its own policy replaces them with its policy's, never
// adding to them.
func TestAdmitPodSettings(t *testing.T) {
	wire := &runtime.PodSettings{Tolerations: []runtime.Toleration{{Key: "dedicated", Operator: "Exists"}}, Annotations: map[string]string{"from": "gateway"}}
	for _, tc := range []struct {
		name   string
		policy *staticPolicy
		want   *runtime.PodSettings
	}{
		{"no policy of its own: the gateway's", nil, wire},
		{"own policy with the same fragment: once", ptrTo(staticPolicy(`{"base": {"pod": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}}`)),
			&runtime.PodSettings{Tolerations: []runtime.Toleration{{Key: "dedicated", Operator: "Exists"}}}},
		{"own policy without a fragment: none", ptrTo(staticPolicy(`{}`)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(&fakeRunner{}, nil, nil)
			if tc.policy != nil {
				s.WithPolicy("r1", *tc.policy)
			}
			req := runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}, Pod: wire}, Lifetime: time.Minute}
			req = createFromProto(createToProto(req)) // as it arrives
			if err := s.admit(context.Background(), &req); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(req.Spec.Pod, tc.want) {
				t.Errorf("pod settings %+v, want %+v", req.Spec.Pod, tc.want)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// The runner's own policy check sees a container-engine sandbox's engine: a runner that
// runs none refuses it (CWSANDBOX_NO_SUITABLE_RUNNER, so the gateway tries another), its
// policy may forbid engines, and the engine's images pass its image rules.
func TestAdmitEngine(t *testing.T) {
	engine := func() runner.CreateRequest {
		req := runner.CreateRequest{Spec: runtime.Spec{
			Container: runtime.Container{Name: runtime.EngineContainerName, Image: "localhost/engine:1"},
			Engine:    &runtime.Engine{Compose: []byte("services: {}"), Project: "sandbox", Images: []string{"docker.io/library/busybox:1", "ghcr.io/x/y:1"}},
		}, Lifetime: time.Minute}
		return createFromProto(createToProto(req)) // as it arrives
	}
	runs := func() policy.Platform {
		p := policy.RunnerPlatform([]string{"runc", "gvisor"})
		p.EngineImage, p.EngineRuntimeClass = "localhost/engine:1", "gvisor"
		return p
	}
	for _, tc := range []struct {
		name     string
		platform func() policy.Platform
		policy   staticPolicy
		reason   string
		field    string
	}{
		{"runs engines", runs, `{}`, "", ""},
		{"runs none", func() policy.Platform { p := runs(); p.NoContainerEngine = true; return p }, `{}`, apierr.NoSuitableRunner, "control"},
		{"forbidden", runs, `{"constraints":{"security":{"container_engine_allowed":false}}}`, apierr.PlacementRejected, "control"},
		{"an engine image", runs, `{"constraints":{"images":{"allowed_registries":["docker.io","localhost"]}}}`, apierr.PlacementRejected, "engine.images[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(&fakeRunner{}, nil, nil)
			s.WithPolicy("r1", tc.policy)
			s.platform = tc.platform
			req := engine()
			err := s.admit(context.Background(), &req)
			if apierr.Reason(err) != tc.reason {
				t.Fatalf("err = %v, want reason %q", err, tc.reason)
			}
			if tc.field != "" && (len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != tc.field) {
				t.Errorf("violations %v, want one on %s", apierr.Violations(err), tc.field)
			}
		})
	}
}
