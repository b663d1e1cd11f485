package runnerapi

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func specToProto(s runtime.Spec) *runnerv1.Spec {
	p := &runnerv1.Spec{
		Id:           s.ID,
		Image:        s.Image,
		Command:      s.Command,
		Args:         s.Args,
		Env:          s.Env,
		WorkingDir:   s.WorkingDir,
		RuntimeClass: s.RuntimeClass,
		RestartLimit: int32(s.RestartLimit),
		Meta:         s.Meta,
		Resources:    resourcesToProto(s.Resources),
		Security:     securityToProto(s.Security),
	}
	p.Volumes, p.VolumeMounts = volumesToProto(s.Volumes, s.VolumeMounts)
	if c := s.PullCredentials; c != nil {
		p.PullCredentials = &runnerv1.Credentials{Username: c.Username, Password: c.Password}
	}
	for _, f := range s.Files {
		p.Files = append(p.Files, &runnerv1.File{Path: f.Path, Content: f.Content, Mode: f.Mode})
	}
	for _, v := range s.Services {
		p.Services = append(p.Services, &runnerv1.Service{Port: int32(v.Port), Name: v.Name, Visibility: v.Visibility,
			Endpoint: v.Endpoint, TokenAuth: v.TokenAuth, TimeoutSeconds: int32(v.TimeoutSeconds)})
	}
	p.ShareTokenHash = s.ShareTokenHash
	p.Network = networkToProto(s.Network)
	p.Pod = podToProto(s.Pod)
	return p
}

func resourcesToProto(r runtime.Resources) *runnerv1.Resources {
	return &runnerv1.Resources{MilliCpu: r.MilliCPU, MemoryBytes: r.MemoryBytes, Pids: r.Pids,
		RequestMilliCpu: r.RequestMilliCPU, RequestMemoryBytes: r.RequestMemoryBytes}
}

func resourcesFromProto(p *runnerv1.Resources) runtime.Resources {
	return runtime.Resources{MilliCPU: p.GetMilliCpu(), MemoryBytes: p.GetMemoryBytes(), Pids: p.GetPids(),
		RequestMilliCPU: p.GetRequestMilliCpu(), RequestMemoryBytes: p.GetRequestMemoryBytes()}
}

func podToProto(ps *runtime.PodSettings) *runnerv1.PodSettings {
	if ps.IsZero() {
		return nil
	}
	p := &runnerv1.PodSettings{
		NodeSelector: ps.NodeSelector, PriorityClassName: ps.PriorityClassName,
		ServiceAccountName: ps.ServiceAccountName, ImagePullSecrets: ps.ImagePullSecrets, Annotations: ps.Annotations,
	}
	for _, t := range ps.Tolerations {
		p.Tolerations = append(p.Tolerations, &runnerv1.Toleration{Key: t.Key, Operator: t.Operator, Value: t.Value,
			Effect: t.Effect, TolerationSeconds: t.TolerationSeconds})
	}
	return p
}

func podFromProto(p *runnerv1.PodSettings) *runtime.PodSettings {
	if p == nil {
		return nil
	}
	ps := &runtime.PodSettings{
		NodeSelector: p.GetNodeSelector(), PriorityClassName: p.GetPriorityClassName(),
		ServiceAccountName: p.GetServiceAccountName(), ImagePullSecrets: p.GetImagePullSecrets(), Annotations: p.GetAnnotations(),
	}
	for _, t := range p.GetTolerations() {
		ps.Tolerations = append(ps.Tolerations, runtime.Toleration{Key: t.GetKey(), Operator: t.GetOperator(), Value: t.GetValue(),
			Effect: t.GetEffect(), TolerationSeconds: t.TolerationSeconds})
	}
	if ps.IsZero() {
		return nil
	}
	return ps
}

func networkToProto(n *runtime.Network) *runnerv1.Network {
	if n == nil {
		return nil
	}
	p := &runnerv1.Network{DenyEgress: n.DenyEgress, DenyIngress: n.DenyIngress}
	for _, r := range n.Egress {
		p.Egress = append(p.Egress, &runnerv1.NetworkRule{Cidr: r.CIDR, Except: r.Except, DnsName: r.DNSName, Tenant: r.Tenant, Any: r.Any, Ports: portsToProto(r.Ports)})
	}
	for _, r := range n.Ingress {
		p.Ingress = append(p.Ingress, &runnerv1.NetworkRule{Cidr: r.CIDR, Except: r.Except, Tenant: r.Tenant, Any: r.Any, Ports: portsToProto(r.Ports)})
	}
	return p
}

// networkFromProto is the inverse of networkToProto. An ingress rule carrying a DNS name
// (which none should) keeps no destination for it, so the runner's validation refuses it
// instead of widening it to something else.
func networkFromProto(p *runnerv1.Network) *runtime.Network {
	if p == nil {
		return nil
	}
	n := &runtime.Network{DenyEgress: p.GetDenyEgress(), DenyIngress: p.GetDenyIngress()}
	for _, r := range p.GetEgress() {
		n.Egress = append(n.Egress, runtime.EgressRule{CIDR: r.GetCidr(), Except: r.GetExcept(), DNSName: r.GetDnsName(), Tenant: r.GetTenant(), Any: r.GetAny(), Ports: portsFromProto(r.GetPorts())})
	}
	for _, r := range p.GetIngress() {
		n.Ingress = append(n.Ingress, runtime.IngressRule{CIDR: r.GetCidr(), Except: r.GetExcept(), Tenant: r.GetTenant(), Any: r.GetAny(), Ports: portsFromProto(r.GetPorts())})
	}
	return n
}

func portsToProto(ps []runtime.PortRange) []*runnerv1.PortRange {
	var out []*runnerv1.PortRange
	for _, p := range ps {
		out = append(out, &runnerv1.PortRange{Protocol: p.Protocol, Port: int32(p.Port), EndPort: int32(p.EndPort)})
	}
	return out
}

func portsFromProto(ps []*runnerv1.PortRange) []runtime.PortRange {
	var out []runtime.PortRange
	for _, p := range ps {
		out = append(out, runtime.PortRange{Protocol: p.GetProtocol(), Port: int(p.GetPort()), EndPort: int(p.GetEndPort())})
	}
	return out
}

func specFromProto(p *runnerv1.Spec) runtime.Spec {
	s := runtime.Spec{
		ID:           p.GetId(),
		Container:    runtime.Container{Image: p.GetImage(), Command: p.GetCommand(), Args: p.GetArgs(), Env: p.GetEnv(), WorkingDir: p.GetWorkingDir(), RestartLimit: int(p.GetRestartLimit()), Resources: resourcesFromProto(p.GetResources()), Security: securityFromProto(p.GetSecurity())},
		RuntimeClass: p.GetRuntimeClass(),
		Meta:         p.GetMeta(),
	}
	s.Volumes, s.VolumeMounts = volumesFromProto(p.GetVolumes(), p.GetVolumeMounts())
	if c := p.GetPullCredentials(); c != nil {
		s.PullCredentials = &runtime.Credentials{Username: c.GetUsername(), Password: c.GetPassword()}
	}
	for _, f := range p.GetFiles() {
		s.Files = append(s.Files, runtime.File{Path: f.GetPath(), Content: f.GetContent(), Mode: f.GetMode()})
	}
	for _, v := range p.GetServices() {
		s.Services = append(s.Services, runtime.Service{Port: int(v.GetPort()), Name: v.GetName(), Visibility: v.GetVisibility(),
			Endpoint: v.GetEndpoint(), TokenAuth: v.GetTokenAuth(), TimeoutSeconds: int(v.GetTimeoutSeconds())})
	}
	s.ShareTokenHash = p.GetShareTokenHash()
	s.Network = networkFromProto(p.GetNetwork())
	s.Pod = podFromProto(p.GetPod())
	return s
}

func createToProto(req runner.CreateRequest) *runnerv1.CreateRequest {
	return &runnerv1.CreateRequest{Spec: specToProto(req.Spec), Lifetime: durationpb.New(req.Lifetime)}
}

func createFromProto(p *runnerv1.CreateRequest) runner.CreateRequest {
	return runner.CreateRequest{Spec: specFromProto(p.GetSpec()), Lifetime: p.GetLifetime().AsDuration()}
}

func sandboxToProto(sb runner.Sandbox) *runnerv1.Sandbox {
	spec := sb.Spec
	spec.PullCredentials = nil
	return &runnerv1.Sandbox{
		Id:           sb.ID,
		Spec:         specToProto(spec),
		State:        runnerv1.State(sb.State),
		Reason:       sb.Reason,
		Message:      sb.Message,
		ExitCode:     sb.ExitCode,
		Restarts:     int32(sb.Restarts),
		OomKills:     int32(sb.OOMKills),
		CreatedAt:    timeToProto(sb.CreatedAt),
		StartedAt:    timeToProto(sb.StartedAt),
		EndedAt:      timeToProto(sb.EndedAt),
		Lifetime:     durationpb.New(sb.Lifetime),
		Deadline:     timeToProto(sb.Deadline),
		Ip:           sb.IP,
		RuntimeClass: sb.RuntimeClass,
		ImageDigest:  sb.ImageDigest,
	}
}

func sandboxFromProto(p *runnerv1.Sandbox) runner.Sandbox {
	sb := runner.Sandbox{
		ID:           p.GetId(),
		Spec:         specFromProto(p.GetSpec()),
		State:        runner.State(p.GetState()),
		Reason:       p.GetReason(),
		Message:      p.GetMessage(),
		Restarts:     int(p.GetRestarts()),
		OOMKills:     int(p.GetOomKills()),
		CreatedAt:    timeFromProto(p.GetCreatedAt()),
		StartedAt:    timeFromProto(p.GetStartedAt()),
		EndedAt:      timeFromProto(p.GetEndedAt()),
		Lifetime:     p.GetLifetime().AsDuration(),
		Deadline:     timeFromProto(p.GetDeadline()),
		IP:           p.GetIp(),
		RuntimeClass: p.GetRuntimeClass(),
		ImageDigest:  p.GetImageDigest(),
	}
	if p.ExitCode != nil {
		c := p.GetExitCode()
		sb.ExitCode = &c
	}
	return sb
}

// capacityToProto is c on the wire. Its Support travels in the fields the wire had
// before it (see supportFromProto): NoEndpoints as the empty edge domain.
func capacityToProto(c runner.Capacity) *runnerv1.CapacityResponse {
	return &runnerv1.CapacityResponse{
		MilliCpu: c.MilliCPU, MemoryBytes: c.MemoryBytes,
		UsedMilliCpu: c.UsedMilliCPU, UsedMemoryBytes: c.UsedMemoryBytes,
		Running:       int32(c.Running),
		ConnectedAt:   timeToProto(c.ConnectedAt),
		Architectures: c.Architectures,
		Gpus:          c.GPUs, UsedGpus: c.UsedGPUs,
		MaxSandboxes:   int32(c.MaxSandboxes),
		RuntimeClasses: c.RuntimeClasses,
		EdgeDomain:     c.EdgeDomain, EdgePort: int32(c.EdgePort),
		DataPlaneUri:     c.DataPlaneURI,
		NoDnsEgress:      c.NoDNSEgress,
		ShareTokens:      !c.NoShareTokens,
		CpuOvercommit:    c.CPUOvercommit,
		DefaultResources: resourcesToProto(c.Defaults),
	}
}

func capacityFromProto(p *runnerv1.CapacityResponse) runner.Capacity {
	return runner.Capacity{
		MilliCPU: p.GetMilliCpu(), MemoryBytes: p.GetMemoryBytes(),
		UsedMilliCPU: p.GetUsedMilliCpu(), UsedMemoryBytes: p.GetUsedMemoryBytes(),
		Running:       int(p.GetRunning()),
		ConnectedAt:   timeFromProto(p.GetConnectedAt()),
		Architectures: p.GetArchitectures(),
		GPUs:          p.GetGpus(), UsedGPUs: p.GetUsedGpus(),
		MaxSandboxes:   int(p.GetMaxSandboxes()),
		RuntimeClasses: p.GetRuntimeClasses(),
		EdgeDomain:     p.GetEdgeDomain(), EdgePort: int(p.GetEdgePort()),
		DataPlaneURI:  p.GetDataPlaneUri(),
		Support:       supportFromProto(p),
		CPUOvercommit: p.GetCpuOvercommit(),
		Defaults:      resourcesFromProto(p.GetDefaultResources()),
	}
}

// supportFromProto is what the runner that answered p cannot do. The wire keeps the
// fields it had before runtime.Support: the edge domain says whether the runner publishes
// endpoints, and share_tokens is positive, so that an older runner, which does not say it
// checks share tokens, is taken not to.
func supportFromProto(p *runnerv1.CapacityResponse) runtime.Support {
	return runtime.Support{
		NoDNSEgress:   p.GetNoDnsEgress(),
		NoEndpoints:   p.GetEdgeDomain() == "",
		NoShareTokens: !p.GetShareTokens(),
	}
}

// Zero times (not yet started, not ended) travel as unset timestamps.
func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func timeFromProto(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}
