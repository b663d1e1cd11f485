package spec

import (
	"net"
	"strconv"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// ServiceStatuses echoes the spec's services with their addresses on the runner's edge
// (domain and port; "" when it has none): a passthrough address from creation on (it is
// only a name), an HTTPS URL once the sandbox runs and its route is live; and each
// endpoint's effective auth and request timeout.
func ServiceStatuses(id string, spec *sandboxv1.SandboxSpec, sb runner.Sandbox, runnerID, domain string, port int) []*sandboxv1.ServiceStatus {
	var out []*sandboxv1.ServiceStatus
	for _, s := range spec.GetServices() {
		st := &sandboxv1.ServiceStatus{Port: s.GetPort(), Name: s.GetName(), Protocol: s.GetProtocol(), Visibility: s.GetVisibility()}
		out = append(out, st)
		ep := s.GetEndpoint()
		if ep == nil {
			// A private port is reached at the sandbox's address, by its organization's
			// other sandboxes.
			// CUSTOM ports likewise, by the sources its ingress rules allow.
			if vis := s.GetVisibility(); (vis == sandboxv1.Visibility_VISIBILITY_PRIVATE || vis == sandboxv1.Visibility_VISIBILITY_CUSTOM) && sb.State == runner.StateRunning && sb.IP != "" {
				st.Url = net.JoinHostPort(sb.IP, strconv.Itoa(int(s.GetPort())))
			}
			continue
		}
		st.Endpoint = endpointStatus(ep)
		if domain == "" || sb.State.Terminal() {
			continue
		}
		host := edge.Host(int(s.GetPort()), id, runnerID, domain)
		switch ep.GetKind() {
		case sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH:
			// The official client reads endpoint.address; url stays for older clients.
			st.Endpoint.Address = net.JoinHostPort(host, strconv.Itoa(port))
			st.Url = st.Endpoint.Address
		case sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS:
			if sb.State == runner.StateRunning {
				st.Endpoint.Url = "https://" + host
				if port != 443 {
					st.Endpoint.Url += ":" + strconv.Itoa(port)
				}
			}
		}
	}
	return out
}

// endpointStatus is what the edge applies of ep: for HTTPS its auth (unset is OPEN) and
// its request timeout (unset is the edge's default); passthrough has neither. The
// official client lists an HTTPS endpoint in service_endpoints only with both.
func endpointStatus(ep *sandboxv1.EndpointSpec) *sandboxv1.EndpointStatus {
	out := &sandboxv1.EndpointStatus{Kind: ep.GetKind(), Auth: ep.GetAuth()}
	if ep.GetKind() != sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS {
		return out
	}
	if out.Auth == sandboxv1.EndpointAuth_ENDPOINT_AUTH_UNSPECIFIED {
		out.Auth = sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN
	}
	out.RequestTimeoutSeconds = ep.GetRequestTimeoutSeconds()
	if out.RequestTimeoutSeconds == 0 {
		out.RequestTimeoutSeconds = DefaultRequestTimeoutSeconds
	}
	return out
}
