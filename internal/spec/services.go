package spec

import (
	"fmt"
	"regexp"
	"time"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/edge"
)

// Limits of an endpoint's request timeout (HTTPS only); 0 means the default. The edge
// enforces them, so they are the edge's.
const (
	DefaultRequestTimeoutSeconds = int32(edge.DefaultTimeout / time.Second)
	MinRequestTimeoutSeconds     = int32(edge.MinTimeout / time.Second)
	MaxRequestTimeoutSeconds     = int32(edge.MaxTimeout / time.Second)
)

// portName is a Kubernetes container port name (IANA_SVC_NAME): at most 15 lowercase
// letters, digits and single hyphens, at least one letter, no hyphen at either end.
var portName = regexp.MustCompile(`^[a-z0-9]([a-z0-9]|-[a-z0-9])*$`)

func validPortName(n string) bool {
	return len(n) <= 15 && portName.MatchString(n) && hasLetter.MatchString(n)
}

// serviceViolations checks the shape of a sandbox's services, every rule at once; how
// many and which kinds a runner allows is its policy's to say. Nothing is narrowed: a
// rule broken is a violation, never a silent change.
func serviceViolations(services []*sandboxv1.Service) []apierr.Violation {
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	ports, names := map[int32]int{}, map[string]int{}
	for i, s := range services {
		f := fmt.Sprintf("sandbox.spec.services[%d]", i)
		switch p := s.GetPort(); {
		case p < 1 || p > 65535:
			add(f+".port", "must be 1-65535, got %d", p)
		default:
			if j, dup := ports[p]; dup {
				add(f+".port", "port %d is already declared by services[%d]", p, j)
			} else {
				ports[p] = i
			}
		}
		if n := s.GetName(); n != "" {
			if !validPortName(n) {
				add(f+".name", "must be a Kubernetes port name: at most 15 lowercase letters, digits and single hyphens, with a letter, no hyphen at either end; got %q", n)
			} else if j, dup := names[n]; dup {
				add(f+".name", "name %q is already used by services[%d]", n, j)
			} else {
				names[n] = i
			}
		}
		proto := s.GetProtocol()
		if _, known := sandboxv1.ServiceProtocol_name[int32(proto)]; !known {
			add(f+".protocol", "unknown protocol %d", proto)
		}
		vis := s.GetVisibility()
		if _, known := sandboxv1.Visibility_name[int32(vis)]; !known {
			add(f+".visibility", "unknown visibility %d", vis)
		}
		ep := s.GetEndpoint()
		if ep == nil {
			if vis == sandboxv1.Visibility_VISIBILITY_PUBLIC {
				add(f+".endpoint", "a PUBLIC service needs an endpoint (kind HTTPS or TLS_PASSTHROUGH): PUBLIC alone creates no address")
			}
			continue
		}
		if vis != sandboxv1.Visibility_VISIBILITY_PUBLIC {
			add(f+".visibility", "must be VISIBILITY_PUBLIC for a service with an endpoint, got %s", vis)
		}
		if proto != sandboxv1.ServiceProtocol_SERVICE_PROTOCOL_UNSPECIFIED && proto != sandboxv1.ServiceProtocol_SERVICE_PROTOCOL_TCP {
			add(f+".protocol", "endpoints carry TCP only; leave protocol unset or TCP, got %s", proto)
		}
		switch ep.GetKind() {
		case sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS:
			if t := ep.GetRequestTimeoutSeconds(); t != 0 && (t < MinRequestTimeoutSeconds || t > MaxRequestTimeoutSeconds) {
				add(f+".endpoint.request_timeout_seconds", "must be %d-%d seconds (0 for the default %d), got %d",
					MinRequestTimeoutSeconds, MaxRequestTimeoutSeconds, DefaultRequestTimeoutSeconds, t)
			}
			if _, known := sandboxv1.EndpointAuth_name[int32(ep.GetAuth())]; !known {
				add(f+".endpoint.auth", "unknown auth %d", ep.GetAuth())
			}
		case sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH:
			// The edge never sees inside the TLS session: it can neither check a token nor
			// time a request.
			if ep.GetAuth() != sandboxv1.EndpointAuth_ENDPOINT_AUTH_UNSPECIFIED {
				add(f+".endpoint.auth", "must be unset for TLS_PASSTHROUGH (the edge does not decrypt, so it cannot check credentials), got %s", ep.GetAuth())
			}
			if ep.GetRequestTimeoutSeconds() != 0 {
				add(f+".endpoint.request_timeout_seconds", "must be unset for TLS_PASSTHROUGH (the edge does not see requests), got %d", ep.GetRequestTimeoutSeconds())
			}
		default:
			add(f+".endpoint.kind", "is required: ENDPOINT_KIND_HTTPS or ENDPOINT_KIND_TLS_PASSTHROUGH")
		}
	}
	return vs
}

var hasLetter = regexp.MustCompile(`[a-z]`)
