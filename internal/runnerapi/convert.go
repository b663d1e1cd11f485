package runnerapi

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func specToProto(s runtime.Spec) *runnerv1.Spec {
	c := containerToProto(s.Container)
	p := &runnerv1.Spec{
		Id:              s.ID,
		Name:            c.Name,
		Image:           c.Image,
		PullCredentials: c.PullCredentials,
		Command:         c.Command,
		Args:            c.Args,
		Env:             c.Env,
		SecretEnv:       c.SecretEnv,
		SecretRefs:      c.SecretRefs,
		WorkingDir:      c.WorkingDir,
		Files:           c.Files,
		Resources:       c.Resources,
		VolumeMounts:    c.VolumeMounts,
		Tmpfs:           c.Tmpfs,
		Security:        c.Security,
		RestartLimit:    c.RestartLimit,
		StartupProbe:    c.StartupProbe,
		DependsOn:       c.DependsOn,
		RuntimeClass:    s.RuntimeClass,
		Meta:            s.Meta,
		HostAliases:     s.HostAliases,
	}
	p.EgressSecretValues = s.EgressSecretValues
	p.Volumes, _ = volumesToProto(s.Volumes, nil)
	for _, sc := range s.Sidecars {
		p.Sidecars = append(p.Sidecars, containerToProto(sc))
	}
	for _, ic := range s.InitContainers {
		p.InitContainers = append(p.InitContainers, containerToProto(ic))
	}
	for _, v := range s.Services {
		p.Services = append(p.Services, &runnerv1.Service{Port: int32(v.Port), Name: v.Name, Visibility: v.Visibility,
			Endpoint: v.Endpoint, TokenAuth: v.TokenAuth, TimeoutSeconds: int32(v.TimeoutSeconds)})
	}
	p.ShareTokenHash = s.ShareTokenHash
	p.Network = networkToProto(s.Network)
	p.Pod = podToProto(s.Pod)
	if e := s.Engine; e != nil {
		p.Engine = &runnerv1.Engine{Compose: e.Compose, Project: e.Project, Images: e.Images}
		for img, cr := range e.PullCredentials {
			if cr == nil {
				continue
			}
			if p.Engine.PullCredentials == nil {
				p.Engine.PullCredentials = map[string]*runnerv1.Credentials{}
			}
			p.Engine.PullCredentials[img] = &runnerv1.Credentials{Username: cr.Username, Password: cr.Password}
		}
	}
	return p
}

// containerToProto is one container on the wire; specToProto spreads the primary's
// fields over Spec (where they were before a sandbox had more than one container).
func containerToProto(c runtime.Container) *runnerv1.Container {
	p := &runnerv1.Container{
		Name:         c.Name,
		Image:        c.Image,
		Command:      c.Command,
		Args:         c.Args,
		Env:          c.Env,
		SecretEnv:    c.SecretEnv,
		SecretRefs:   secretRefsToProto(c.SecretRefs),
		WorkingDir:   c.WorkingDir,
		Resources:    resourcesToProto(c.Resources),
		Tmpfs:        c.Tmpfs,
		Security:     securityToProto(c.Security),
		RestartLimit: int32(c.RestartLimit),
		StartupProbe: probeToProto(c.StartupProbe),
	}
	_, p.VolumeMounts = volumesToProto(nil, c.VolumeMounts)
	if cr := c.PullCredentials; cr != nil {
		p.PullCredentials = &runnerv1.Credentials{Username: cr.Username, Password: cr.Password}
	}
	for _, f := range c.Files {
		p.Files = append(p.Files, &runnerv1.File{Path: f.Path, Content: f.Content, Mode: f.Mode})
	}
	for _, d := range c.DependsOn {
		p.DependsOn = append(p.DependsOn, &runnerv1.Dependency{Container: d.Container, Condition: d.Condition})
	}
	return p
}

func containerFromProto(p *runnerv1.Container) runtime.Container {
	c := runtime.Container{
		Name:         p.GetName(),
		Image:        p.GetImage(),
		Command:      p.GetCommand(),
		Args:         p.GetArgs(),
		Env:          p.GetEnv(),
		SecretEnv:    p.GetSecretEnv(),
		SecretRefs:   secretRefsFromProto(p.GetSecretRefs()),
		WorkingDir:   p.GetWorkingDir(),
		Resources:    resourcesFromProto(p.GetResources()),
		Tmpfs:        p.GetTmpfs(),
		Security:     securityFromProto(p.GetSecurity()),
		RestartLimit: int(p.GetRestartLimit()),
		StartupProbe: probeFromProto(p.GetStartupProbe()),
	}
	_, c.VolumeMounts = volumesFromProto(nil, p.GetVolumeMounts())
	if cr := p.GetPullCredentials(); cr != nil {
		c.PullCredentials = &runtime.Credentials{Username: cr.GetUsername(), Password: cr.GetPassword()}
	}
	for _, f := range p.GetFiles() {
		c.Files = append(c.Files, runtime.File{Path: f.GetPath(), Content: f.GetContent(), Mode: f.GetMode()})
	}
	for _, d := range p.GetDependsOn() {
		c.DependsOn = append(c.DependsOn, runtime.Dependency{Container: d.GetContainer(), Condition: d.GetCondition()})
	}
	return c
}

func probeToProto(pr *runtime.Probe) *runnerv1.Probe {
	if pr == nil {
		return nil
	}
	return &runnerv1.Probe{Exec: pr.Exec, InitialDelay: durationpb.New(pr.InitialDelay), Period: durationpb.New(pr.Period),
		Timeout: durationpb.New(pr.Timeout), FailureThreshold: int32(pr.FailureThreshold)}
}

func probeFromProto(p *runnerv1.Probe) *runtime.Probe {
	if p == nil {
		return nil
	}
	return &runtime.Probe{Exec: p.GetExec(), InitialDelay: p.GetInitialDelay().AsDuration(), Period: p.GetPeriod().AsDuration(),
		Timeout: p.GetTimeout().AsDuration(), FailureThreshold: int(p.GetFailureThreshold())}
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
		pr := &runnerv1.NetworkRule{Cidr: r.CIDR, Except: r.Except, DnsName: r.DNSName, Tenant: r.Tenant, Any: r.Any, Ports: portsToProto(r.Ports)}
		if sec := r.Secret; sec != nil {
			pr.Secret = &runnerv1.EgressSecret{Store: sec.Store, Path: sec.Path, Field: sec.Field, Header: sec.Header, EnvVar: sec.EnvVar}
		}
		p.Egress = append(p.Egress, pr)
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
		er := runtime.EgressRule{CIDR: r.GetCidr(), Except: r.GetExcept(), DNSName: r.GetDnsName(), Tenant: r.GetTenant(), Any: r.GetAny(), Ports: portsFromProto(r.GetPorts())}
		if sec := r.GetSecret(); sec != nil {
			er.Secret = &runtime.EgressSecret{Store: sec.GetStore(), Path: sec.GetPath(), Field: sec.GetField(), Header: sec.GetHeader(), EnvVar: sec.GetEnvVar()}
		}
		n.Egress = append(n.Egress, er)
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
		ID: p.GetId(),
		Container: containerFromProto(&runnerv1.Container{
			Name: p.GetName(), Image: p.GetImage(), PullCredentials: p.GetPullCredentials(), Command: p.GetCommand(),
			Args: p.GetArgs(), Env: p.GetEnv(), SecretEnv: p.GetSecretEnv(), SecretRefs: p.GetSecretRefs(), WorkingDir: p.GetWorkingDir(), Files: p.GetFiles(), Resources: p.GetResources(),
			VolumeMounts: p.GetVolumeMounts(), Tmpfs: p.GetTmpfs(), Security: p.GetSecurity(), RestartLimit: p.GetRestartLimit(),
			StartupProbe: p.GetStartupProbe(), DependsOn: p.GetDependsOn(),
		}),
		RuntimeClass: p.GetRuntimeClass(),
		Meta:         p.GetMeta(),
		HostAliases:  p.GetHostAliases(),
	}
	s.EgressSecretValues = p.GetEgressSecretValues()
	s.Volumes, _ = volumesFromProto(p.GetVolumes(), nil)
	for _, c := range p.GetSidecars() {
		s.Sidecars = append(s.Sidecars, containerFromProto(c))
	}
	for _, c := range p.GetInitContainers() {
		s.InitContainers = append(s.InitContainers, containerFromProto(c))
	}
	for _, v := range p.GetServices() {
		s.Services = append(s.Services, runtime.Service{Port: int(v.GetPort()), Name: v.GetName(), Visibility: v.GetVisibility(),
			Endpoint: v.GetEndpoint(), TokenAuth: v.GetTokenAuth(), TimeoutSeconds: int(v.GetTimeoutSeconds())})
	}
	s.ShareTokenHash = p.GetShareTokenHash()
	s.Network = networkFromProto(p.GetNetwork())
	s.Pod = podFromProto(p.GetPod())
	if e := p.GetEngine(); e != nil {
		s.Engine = &runtime.Engine{Compose: e.GetCompose(), Project: e.GetProject(), Images: e.GetImages()}
		for img, cr := range e.GetPullCredentials() {
			if s.Engine.PullCredentials == nil {
				s.Engine.PullCredentials = map[string]*runtime.Credentials{}
			}
			s.Engine.PullCredentials[img] = &runtime.Credentials{Username: cr.GetUsername(), Password: cr.GetPassword()}
		}
	}
	return s
}

// createToProto is req on the wire: each of req.Restores travels as the restore of the
// volume it names (Client.Create refuses one that names no volume before it gets here).
func createToProto(req runner.CreateRequest) *runnerv1.CreateRequest {
	p := &runnerv1.CreateRequest{Spec: specToProto(req.Spec), Lifetime: durationpb.New(req.Lifetime)}
	for _, v := range p.Spec.GetVolumes() {
		if src, ok := req.Restores[v.GetName()]; ok {
			v.Restore = sourceToProto(src)
		}
	}
	return p
}

func createFromProto(p *runnerv1.CreateRequest) runner.CreateRequest {
	req := runner.CreateRequest{Spec: specFromProto(p.GetSpec()), Lifetime: p.GetLifetime().AsDuration()}
	for _, v := range p.GetSpec().GetVolumes() {
		if v.GetRestore() == nil {
			continue
		}
		if req.Restores == nil {
			req.Restores = map[string]runner.SnapshotSource{}
		}
		req.Restores[v.GetName()] = sourceFromProto(v.GetRestore())
	}
	return req
}

func sourceToProto(s runner.SnapshotSource) *runnerv1.SnapshotSource {
	return &runnerv1.SnapshotSource{SnapshotId: s.SnapshotID, BlobKey: s.BlobKey, Digest: s.Digest,
		SizeBytes: s.SizeBytes, ContentBytes: s.ContentBytes, Bucket: s.Bucket}
}

func sourceFromProto(p *runnerv1.SnapshotSource) runner.SnapshotSource {
	return runner.SnapshotSource{SnapshotID: p.GetSnapshotId(), BlobKey: p.GetBlobKey(), Digest: p.GetDigest(),
		SizeBytes: p.GetSizeBytes(), ContentBytes: p.GetContentBytes(), Bucket: p.GetBucket()}
}

func targetToProto(t runner.SnapshotTarget) *runnerv1.SnapshotTarget {
	return &runnerv1.SnapshotTarget{Volume: t.Volume, SnapshotId: t.SnapshotID, BlobKey: t.BlobKey, MaxSizeBytes: t.MaxSizeBytes, Bucket: t.Bucket}
}

func targetFromProto(p *runnerv1.SnapshotTarget) runner.SnapshotTarget {
	return runner.SnapshotTarget{Volume: p.GetVolume(), SnapshotID: p.GetSnapshotId(), BlobKey: p.GetBlobKey(), MaxSizeBytes: p.GetMaxSizeBytes(), Bucket: p.GetBucket()}
}

func targetsToProto(ts []runner.SnapshotTarget) []*runnerv1.SnapshotTarget {
	var out []*runnerv1.SnapshotTarget
	for _, t := range ts {
		out = append(out, targetToProto(t))
	}
	return out
}

func targetsFromProto(ps []*runnerv1.SnapshotTarget) []runner.SnapshotTarget {
	var out []runner.SnapshotTarget
	for _, p := range ps {
		out = append(out, targetFromProto(p))
	}
	return out
}

func jobToProto(j runner.SnapshotJob) *runnerv1.SnapshotJob {
	p := &runnerv1.SnapshotJob{
		SnapshotId: j.SnapshotID, SandboxId: clipShort(j.SandboxID), Volume: clipShort(j.Volume),
		State:  runnerv1.SnapshotJobState(j.State),
		Reason: clipText(j.Reason), Message: clipText(j.Message),
		SizeBytes: j.SizeBytes, Digest: clipShort(j.Digest), ContentBytes: j.ContentBytes,
		CompleteTime: timeToProto(j.CompleteTime),
		Unknown:      j.Unknown,
	}
	if j.Pause != 0 {
		p.Pause = durationpb.New(j.Pause)
	}
	return p
}

// jobFromProto is the inverse of jobToProto. A state this side does not know (a newer
// runner's) is FAILED with the runner's reason, so a job never looks READY by mistake.
func jobFromProto(p *runnerv1.SnapshotJob) runner.SnapshotJob {
	j := runner.SnapshotJob{
		SnapshotID: p.GetSnapshotId(), SandboxID: p.GetSandboxId(), Volume: p.GetVolume(),
		State:  runner.SnapshotJobState(p.GetState()),
		Reason: p.GetReason(), Message: p.GetMessage(),
		SizeBytes: p.GetSizeBytes(), Digest: p.GetDigest(), ContentBytes: p.GetContentBytes(),
		CompleteTime: timeFromProto(p.GetCompleteTime()),
		Unknown:      p.GetUnknown(),
	}
	if p.GetPause() != nil {
		j.Pause = p.GetPause().AsDuration()
	}
	switch j.State {
	case runner.SnapshotCreating, runner.SnapshotReady, runner.SnapshotFailed:
	default:
		j.State = runner.SnapshotFailed
		if j.Message == "" {
			j.Message = fmt.Sprintf("the runner reported snapshot state %d", p.GetState())
		}
	}
	return j
}

func jobsToProto(js []runner.SnapshotJob) []*runnerv1.SnapshotJob {
	var out []*runnerv1.SnapshotJob
	for _, j := range js {
		out = append(out, jobToProto(j))
	}
	return out
}

func jobsFromProto(ps []*runnerv1.SnapshotJob) []runner.SnapshotJob {
	var out []runner.SnapshotJob
	for _, p := range ps {
		out = append(out, jobFromProto(p))
	}
	return out
}

func sandboxToProto(sb runner.Sandbox) *runnerv1.Sandbox {
	spec := withoutCredentials(sb.Spec)
	return &runnerv1.Sandbox{
		Containers:   containerStatusesToProto(sb.Containers),
		Id:           sb.ID,
		Spec:         specToProto(spec),
		State:        runnerv1.State(sb.State),
		Reason:       clipText(sb.Reason),
		Message:      clipText(sb.Message),
		ExitCode:     sb.ExitCode,
		Restarts:     int32(sb.Restarts),
		OomKills:     int32(sb.OOMKills),
		CreatedAt:    timeToProto(sb.CreatedAt),
		StartedAt:    timeToProto(sb.StartedAt),
		EndedAt:      timeToProto(sb.EndedAt),
		Lifetime:     durationpb.New(sb.Lifetime),
		Deadline:     timeToProto(sb.Deadline),
		Ip:           clipShort(sb.IP),
		RuntimeClass: clipShort(sb.RuntimeClass),
		ImageDigest:  clipShort(sb.ImageDigest),
		Pause:        pauseToProto(sb.Pause),
		Usage:        usageToProto(sb.Usage),
	}
}

func usageToProto(u *runner.Usage) *runnerv1.ResourceUsage {
	if u == nil {
		return nil
	}
	return &runnerv1.ResourceUsage{CpuMillicores: u.CPUMillicores, CpuUsageUsec: u.CPUUsec, MemoryBytes: u.MemoryBytes, MemoryPeakBytes: u.MemoryPeakBytes}
}

func usageFromProto(p *runnerv1.ResourceUsage) *runner.Usage {
	if p == nil {
		return nil
	}
	u := &runner.Usage{CPUMillicores: p.GetCpuMillicores()}
	u.CPUUsec, u.MemoryBytes, u.MemoryPeakBytes = p.GetCpuUsageUsec(), p.GetMemoryBytes(), p.GetMemoryPeakBytes()
	return u
}

func pauseToProto(ps *runner.PauseStatus) *runnerv1.PauseStatus {
	if ps == nil {
		return nil
	}
	return &runnerv1.PauseStatus{Released: ps.Released, AutoResume: ps.AutoResume, LifetimeHeld: ps.LifetimeHeld,
		PausedAt: timeToProto(ps.PausedAt), CheckpointBytes: ps.CheckpointBytes}
}

func pauseFromProto(p *runnerv1.PauseStatus) *runner.PauseStatus {
	if p == nil {
		return nil
	}
	return &runner.PauseStatus{Released: p.GetReleased(), AutoResume: p.GetAutoResume(), LifetimeHeld: p.GetLifetimeHeld(),
		PausedAt: timeFromProto(p.GetPausedAt()), CheckpointBytes: p.GetCheckpointBytes()}
}

// sandboxFromProto is the sandbox a runner answered; nil (a reply without one, which a
// runner may send: it is not trusted) reads as an empty message does.
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
		Usage:        usageFromProto(p.GetUsage()),
	}
	if p != nil && p.ExitCode != nil {
		c := p.GetExitCode()
		sb.ExitCode = &c
	}
	sb.Containers = containerStatusesFromProto(p.GetContainers())
	if sb.State == runner.StatePaused {
		sb.Pause = pauseFromProto(p.GetPause())
		if sb.Pause == nil {
			sb.Pause = &runner.PauseStatus{} // PAUSED always says how
		}
	}
	return sb
}

// withoutCredentials is s without the pull credentials and secret environment of any of
// its containers: they are for one pull (one start), never sent back once the sandbox
// exists. The slices it changes are
// copies (s's are the caller's).
func withoutCredentials(s runtime.Spec) runtime.Spec {
	s.PullCredentials, s.SecretEnv, s.EgressSecretValues = nil, nil, nil
	strip := func(cs []runtime.Container) []runtime.Container {
		if cs == nil {
			return nil
		}
		out := make([]runtime.Container, len(cs))
		for i, c := range cs {
			c.PullCredentials, c.SecretEnv = nil, nil
			out[i] = c
		}
		return out
	}
	s.Sidecars, s.InitContainers = strip(s.Sidecars), strip(s.InitContainers)
	if s.Engine != nil && s.Engine.PullCredentials != nil {
		e := *s.Engine
		e.PullCredentials = nil
		s.Engine = &e
	}
	return s
}

func containerStatusesToProto(cs []runtime.ContainerStatus) []*runnerv1.ContainerStatus {
	var out []*runnerv1.ContainerStatus
	for _, c := range cs {
		out = append(out, &runnerv1.ContainerStatus{Name: clipShort(c.Name), Init: c.Init, State: clipShort(c.State), ExitCode: c.ExitCode,
			Restarts: int32(c.Restarts), Reason: clipText(c.Reason), Message: clipText(c.Message)})
	}
	return out
}

func containerStatusesFromProto(ps []*runnerv1.ContainerStatus) []runtime.ContainerStatus {
	var out []runtime.ContainerStatus
	for _, p := range ps {
		c := runtime.ContainerStatus{Name: p.GetName(), Init: p.GetInit(), State: p.GetState(),
			Restarts: int(p.GetRestarts()), Reason: p.GetReason(), Message: p.GetMessage()}
		if p.ExitCode != nil {
			code := p.GetExitCode()
			c.ExitCode = &code
		}
		out = append(out, c)
	}
	return out
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
		VolumeNamespace:  c.VolumeNamespace,
		NoDnsEgress:      c.NoDNSEgress,
		ShareTokens:      !c.NoShareTokens,
		CpuOvercommit:    c.CPUOvercommit,
		DefaultResources: resourcesToProto(c.Defaults),
		// No engine image says the runner runs no container-engine sandbox.
		EngineImage:           engineImageToProto(c),
		EngineRuntimeClass:    c.EngineRuntimeClass,
		EngineUnavailable:     c.EngineUnavailable,
		Snapshots:             !c.NoSnapshots,
		SecretRefs:            !c.NoSecretRefs,
		NoGlobalVolumes:       c.NoGlobalVolumes,
		NoGlobalVolumeWriters: c.NoGlobalVolumeWriters,
		NoEgressSecrets:       c.NoEgressSecrets,
		CachedSnapshots:       c.CachedSnapshots,
		Paused:                int32(c.Paused),
		CheckpointClasses:     c.CheckpointClasses,
		CheckpointPlatforms:   c.CheckpointPlatforms,
		BuilderImage:          c.BuilderImage,
		BuildUnavailable:      c.BuildUnavailable,
	}
}

func engineImageToProto(c runner.Capacity) string {
	if c.NoContainerEngine {
		return ""
	}
	return c.EngineImage
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
		DataPlaneURI:        p.GetDataPlaneUri(),
		VolumeNamespace:     p.GetVolumeNamespace(),
		Support:             supportFromProto(p),
		CPUOvercommit:       p.GetCpuOvercommit(),
		Defaults:            resourcesFromProto(p.GetDefaultResources()),
		EngineImage:         p.GetEngineImage(),
		EngineRuntimeClass:  p.GetEngineRuntimeClass(),
		EngineUnavailable:   p.GetEngineUnavailable(),
		CachedSnapshots:     cachedFromProto(p.GetCachedSnapshots()),
		Paused:              int(p.GetPaused()),
		CheckpointClasses:   p.GetCheckpointClasses()[:min(len(p.GetCheckpointClasses()), maxCheckpointClasses)],
		CheckpointPlatforms: platformsFromProto(p.GetCheckpointPlatforms()),
		BuilderImage:        p.GetBuilderImage(),
		BuildUnavailable:    p.GetBuildUnavailable(),
	}
}

// maxCheckpointClasses bounds the checkpoint classes (and their platforms) taken from a
// runner's answer.
const maxCheckpointClasses = 64

// Bounds of one checkpoint platform entry taken from a runner's answer.
const (
	maxClassNameLen = 253
	maxPlatformLen  = 256
)

// platformsFromProto is at most maxCheckpointClasses of a runner's checkpoint platforms
// (the first by class name), without an entry whose class or platform is empty or too
// long.
func platformsFromProto(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if len(out) == maxCheckpointClasses {
			break
		}
		if v := m[k]; len(k) <= maxClassNameLen && v != "" && len(v) <= maxPlatformLen {
			out[k] = v
		}
	}
	return out
}

func refToProto(r runner.CheckpointRef) *runnerv1.CheckpointRef {
	p := &runnerv1.CheckpointRef{Key: r.Key, Platform: r.Platform, Bytes: r.Bytes}
	if st := r.Egress; st != nil {
		p.Egress = &runnerv1.EgressState{CaCert: st.CACert, CaKey: st.CAKey}
		for _, in := range st.Injections {
			p.Egress.Injections = append(p.Egress.Injections, &runnerv1.EgressInjection{Host: in.Host, Header: in.Header, Placeholder: in.Placeholder, Secret: in.Secret})
		}
	}
	return p
}

// refFromProto is p as the runner takes it. Its egress state is checked by the
// importing runner (egress.Restore: sizes, the CA, its key); here more injections than
// any state has are cut to one more than the most (still refused).
func refFromProto(p *runnerv1.CheckpointRef) runner.CheckpointRef {
	r := runner.CheckpointRef{Key: p.GetKey(), Platform: p.GetPlatform(), Bytes: p.GetBytes()}
	if e := p.GetEgress(); e != nil {
		r.Egress = &runtime.EgressState{CACert: e.GetCaCert(), CAKey: e.GetCaKey()}
		injs := e.GetInjections()
		for _, in := range injs[:min(len(injs), egress.MaxStateInjections+1)] {
			r.Egress.Injections = append(r.Egress.Injections, runtime.EgressInjection{Host: in.GetHost(), Header: in.GetHeader(), Placeholder: in.GetPlaceholder(), Secret: in.GetSecret()})
		}
	}
	return r
}

func forkTargetsToProto(ts []runner.ForkTarget) []*runnerv1.ForkTarget {
	out := make([]*runnerv1.ForkTarget, len(ts))
	for i, t := range ts {
		out[i] = &runnerv1.ForkTarget{Id: t.ID, Meta: t.Meta, ShareTokenHash: t.ShareTokenHash, EgressSecretValues: t.EgressSecretValues}
		if t.Lifetime != 0 {
			out[i].Lifetime = durationpb.New(t.Lifetime)
		}
	}
	return out
}

func forkTargetsFromProto(ps []*runnerv1.ForkTarget) []runner.ForkTarget {
	out := make([]runner.ForkTarget, len(ps))
	for i, p := range ps {
		out[i] = runner.ForkTarget{ID: p.GetId(), Meta: p.GetMeta(), ShareTokenHash: p.GetShareTokenHash(), Lifetime: p.GetLifetime().AsDuration(), EgressSecretValues: p.GetEgressSecretValues()}
	}
	return out
}

// cachedFromProto is at most runner.MaxCachedSnapshotsReported of a runner's cached
// digests.
func cachedFromProto(ds []string) []string {
	return ds[:min(len(ds), runner.MaxCachedSnapshotsReported)]
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
		// A runner without an engine image (or an older one, which does not say) runs
		// no container-engine sandbox.
		NoContainerEngine: p.GetEngineImage() == "",
		// An older runner, which does not say it takes snapshots, is taken not to.
		NoSnapshots: !p.GetSnapshots(),
		// Likewise KUBERNETES secret store references.
		NoSecretRefs: !p.GetSecretRefs(),
		// Likewise GLOBAL volumes.
		NoGlobalVolumes: p.GetNoGlobalVolumes(),
		// An older runner, which does not say, commits a writer's copy (or refuses it).
		NoGlobalVolumeWriters: p.GetNoGlobalVolumeWriters(),
		// An older runner, which does not say, injects them or reports NoDNSEgress.
		NoEgressSecrets: p.GetNoEgressSecrets(),
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

func secretRefsToProto(rs []runtime.SecretRef) []*runnerv1.SecretRef {
	var out []*runnerv1.SecretRef
	for _, r := range rs {
		out = append(out, &runnerv1.SecretRef{EnvVar: r.EnvVar, Store: r.Store, Secret: r.Secret, Key: r.Key})
	}
	return out
}

func secretRefsFromProto(rs []*runnerv1.SecretRef) []runtime.SecretRef {
	var out []runtime.SecretRef
	for _, r := range rs {
		out = append(out, runtime.SecretRef{EnvVar: r.GetEnvVar(), Store: r.GetStore(), Secret: r.GetSecret(), Key: r.GetKey()})
	}
	return out
}
