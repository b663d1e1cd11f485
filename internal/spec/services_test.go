package spec

import (
	"slices"
	"strings"
	"testing"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

func TestServiceViolations(t *testing.T) {
	const (
		public  = sandboxv1.Visibility_VISIBILITY_PUBLIC
		private = sandboxv1.Visibility_VISIBILITY_PRIVATE
		https   = sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS
		pass    = sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH
		token   = sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN
		udp     = sandboxv1.ServiceProtocol_SERVICE_PROTOCOL_UDP
		sctp    = sandboxv1.ServiceProtocol_SERVICE_PROTOCOL_SCTP
		tcp     = sandboxv1.ServiceProtocol_SERVICE_PROTOCOL_TCP
	)
	ep := func(k sandboxv1.EndpointKind, a sandboxv1.EndpointAuth, timeout int32) *sandboxv1.EndpointSpec {
		return &sandboxv1.EndpointSpec{Kind: k, Auth: a, RequestTimeoutSeconds: timeout}
	}
	for _, tt := range []struct {
		name     string
		services []*sandboxv1.Service
		want     []string // fields with a violation, in order
	}{
		{"none", nil, nil},
		{"https open, passthrough, private, internal", []*sandboxv1.Service{
			{Port: 8080, Name: "web", Visibility: public, Endpoint: ep(https, 0, 0)},
			{Port: 8443, Visibility: public, Protocol: tcp, Endpoint: ep(pass, 0, 0)},
			{Port: 9000, Name: "metrics-2", Visibility: private},
			{Port: 5353, Protocol: udp},
			{Port: 8081, Visibility: public, Endpoint: ep(https, token, 900)},
		}, nil},
		{"ports out of range", []*sandboxv1.Service{{Port: 0}, {Port: 65536}, {Port: -1}},
			[]string{"services[0].port", "services[1].port", "services[2].port"}},
		{"duplicate port and name", []*sandboxv1.Service{{Port: 80, Name: "a"}, {Port: 80, Name: "a"}},
			[]string{"services[1].port", "services[1].name"}},
		{"bad names", []*sandboxv1.Service{{Port: 1, Name: "HTTP"}, {Port: 2, Name: "-web"}, {Port: 3, Name: "web--x"},
			{Port: 4, Name: "1234"}, {Port: 5, Name: "abcdefghijklmnop"}, {Port: 6, Name: "web_x"}},
			[]string{"services[0].name", "services[1].name", "services[2].name", "services[3].name", "services[4].name", "services[5].name"}},
		{"public without endpoint", []*sandboxv1.Service{{Port: 80, Visibility: public}}, []string{"services[0].endpoint"}},
		{"endpoint without public", []*sandboxv1.Service{{Port: 80, Endpoint: ep(https, 0, 0)}, {Port: 81, Visibility: private, Endpoint: ep(https, 0, 0)}},
			[]string{"services[0].visibility", "services[1].visibility"}},
		{"endpoint over UDP or SCTP", []*sandboxv1.Service{{Port: 80, Protocol: udp, Visibility: public, Endpoint: ep(https, 0, 0)},
			{Port: 81, Protocol: sctp, Visibility: public, Endpoint: ep(pass, 0, 0)}},
			[]string{"services[0].protocol", "services[1].protocol"}},
		{"endpoint kind missing", []*sandboxv1.Service{{Port: 80, Visibility: public, Endpoint: ep(0, 0, 0)}}, []string{"services[0].endpoint.kind"}},
		{"passthrough with auth or timeout", []*sandboxv1.Service{{Port: 80, Visibility: public, Endpoint: ep(pass, token, 0)},
			{Port: 81, Visibility: public, Endpoint: ep(pass, 0, 30)}},
			[]string{"services[0].endpoint.auth", "services[1].endpoint.request_timeout_seconds"}},
		{"https timeout bounds", []*sandboxv1.Service{{Port: 80, Visibility: public, Endpoint: ep(https, 0, 14)},
			{Port: 81, Visibility: public, Endpoint: ep(https, 0, 901)}, {Port: 82, Visibility: public, Endpoint: ep(https, 0, 15)}},
			[]string{"services[0].endpoint.request_timeout_seconds", "services[1].endpoint.request_timeout_seconds"}},
		{"unknown enums", []*sandboxv1.Service{{Port: 80, Protocol: 9, Visibility: 7}}, []string{"services[0].protocol", "services[0].visibility"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, v := range serviceViolations(tt.services) {
				got = append(got, strings.TrimPrefix(v.Field, "sandbox.spec."))
				if v.Description == "" {
					t.Errorf("%s: no description", v.Field)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("violations on %v, want %v", got, tt.want)
			}
		})
	}
}

func FuzzServiceViolations(f *testing.F) {
	f.Add(int32(8080), "web", int32(1), int32(1), int32(1), int32(0), int32(0), true)
	f.Add(int32(0), "", int32(2), int32(0), int32(2), int32(2), int32(30), true)
	f.Fuzz(func(t *testing.T, port int32, name string, vis, proto, kind, auth, timeout int32, withEndpoint bool) {
		s := &sandboxv1.Service{Port: port, Name: name, Visibility: sandboxv1.Visibility(vis), Protocol: sandboxv1.ServiceProtocol(proto)}
		if withEndpoint {
			s.Endpoint = &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind(kind), Auth: sandboxv1.EndpointAuth(auth), RequestTimeoutSeconds: timeout}
		}
		vs := serviceViolations([]*sandboxv1.Service{s, s})
		// The same service twice always repeats its port (when valid).
		if port >= 1 && port <= 65535 {
			if !slices.ContainsFunc(vs, func(v apierr.Violation) bool { return v.Field == "sandbox.spec.services[1].port" }) {
				t.Errorf("duplicate port %d not reported: %v", port, vs)
			}
		}
		// An accepted endpoint is PUBLIC over TCP with a kind.
		if len(serviceViolations([]*sandboxv1.Service{s})) == 0 && withEndpoint {
			if s.Visibility != sandboxv1.Visibility_VISIBILITY_PUBLIC || (proto != 0 && proto != 1) || (kind != 1 && kind != 2) {
				t.Errorf("accepted %v", s)
			}
		}
	})
}
