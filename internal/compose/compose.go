// Package compose translates a Compose file (CreateSandboxFromFile) into the sandbox
// spec a hand-written CreateSandbox would carry, so the gateway resolves, validates,
// places and runs it exactly like one: one container per service, the primary named by
// primary_service. What the public wire cannot carry (depends_on, the service names as
// host names, tmpfs) travels beside the spec as Extra, which the gateway applies to the
// runtime spec after converting the resolved wire spec.
//
// The translation is pure: it parses the bytes it is given and nothing else. compose-go
// never reads the server's files or environment: keys that would (env_file, extends,
// include, host bind mounts, secrets and configs, environment entries without a value)
// are refused before it loads the file, and interpolation sees an empty environment, so
// only ${VAR:-default} and ${VAR-default} have a value (see Interpolation).
//
// Every key the file sets is translated or refused with a field violation naming it
// (services.<name>.<key>); none is silently ignored. The one key not acted on is a
// service's `build` when the service also names an `image`: as the official client
// documents, the image runs and the build section is skipped. A service with `build`
// and no image is a Build (Result.Builds: its Dockerfile inline or in its context, the
// context's tar as sent in build_contexts) that the gateway builds before it creates the
// sandbox.
package compose

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/template"
	"github.com/compose-spec/compose-go/v2/types"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// MaxContentsBytes bounds a Compose file: the official client's cap (256 KiB raw YAML).
const MaxContentsBytes = 256 << 10

// Interpolation is the rule documented in docs/api.md: the server has no environment for
// a Compose file, so every variable is unset.
const Interpolation = "every variable is unset: ${VAR:-default} and ${VAR-default} give default, ${VAR:+x} gives nothing, " +
	"$$ is a literal $; a variable with no default ($VAR, ${VAR}) and ${VAR:?message} are refused"

// projectName is the Compose project name of every file: it names nothing a caller sees.
const projectName = "sandbox"

// violation is one refused field of the file.
type violation struct{ field, description string }

// Result is a translated file.
type Result struct {
	// Spec is the sandbox spec the file describes, as a CreateSandbox request carries it.
	Spec *sandboxv1.SandboxSpec
	// Extra is what the public wire cannot carry; the gateway applies it to the runtime
	// spec converted from Spec (after the policy resolved Spec).
	Extra Extra
	// Builds are the services to build (by service name): each one's container in Spec
	// has no image; the gateway builds it and sets the image it pushed.
	Builds map[string]Build
}

// Extra is the part of a translated file that has no field on the public wire.
type Extra struct {
	// Primary names the primary service (its container).
	Primary string `json:"primary"`
	// DependsOn holds each service's depends_on.
	DependsOn map[string][]runtime.Dependency `json:"depends_on,omitempty"`
	// Tmpfs holds each service's tmpfs paths.
	Tmpfs map[string][]string `json:"tmpfs,omitempty"`
	// HostAliases are the service names: each resolves to the sandbox (127.0.0.1) in
	// every container, as Compose's service names resolve on its network.
	HostAliases []string `json:"host_aliases,omitempty"`
	// Engine is set for control CONTROL_CONTAINER_ENGINE: what the sandbox's engine runs
	// (the public wire has no field for it), and what the policy checks beside the spec.
	Engine *runtime.Engine `json:"engine,omitempty"`
}

// Apply adds e to s, the runtime spec converted from the Result's Spec. A container that
// e names and s lacks is an error: the conversion dropped a service.
func (e Extra) Apply(s *runtime.Spec) error {
	if e.Engine != nil {
		if s.Name != "" && s.Name != runtime.DefaultContainerName && s.Name != runtime.EngineContainerName || s.Multi() {
			return fmt.Errorf("compose: a container-engine sandbox has one container, %s", runtime.EngineContainerName)
		}
		s.Name = runtime.EngineContainerName
		s.Engine = e.Engine.Clone()
		return nil
	}
	find := func(name string) (*runtime.Container, error) {
		if c, init := s.Find(name); c != nil && !init {
			return c, nil
		}
		if name == e.Primary && (s.Name == "" || s.Name == name) {
			return &s.Container, nil
		}
		return nil, fmt.Errorf("compose: the sandbox spec has no container %q", name)
	}
	for _, name := range sortedNames(e.DependsOn) {
		c, err := find(name)
		if err != nil {
			return err
		}
		c.DependsOn = slices.Clone(e.DependsOn[name])
	}
	for _, name := range sortedNames(e.Tmpfs) {
		c, err := find(name)
		if err != nil {
			return err
		}
		c.Tmpfs = slices.Clone(e.Tmpfs[name])
	}
	s.HostAliases = slices.Clone(e.HostAliases)
	return nil
}

func sortedNames[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Convert translates req. Its errors are API errors: INVALID_ARGUMENT
// (CWSANDBOX_INVALID_REQUEST) with a field violation for each problem, UNIMPLEMENTED
// (CWSANDBOX_NOT_IMPLEMENTED) for a service left to build, another file type or a build
// option. Container-engine control (translateEngine) gives one container and
// Extra.Engine; placement sends it only to runners that run it.
func Convert(ctx context.Context, req *sandboxv1.CreateSandboxFromFileRequest) (Result, error) {
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	switch req.GetType() {
	case sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE:
	case sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_UNSPECIFIED:
		add("type", "is required (SANDBOX_FILE_TYPE_COMPOSE)")
	default:
		return Result{}, apierr.Newf(apierr.NotImplemented, "file type %v is not supported by this sandboxd; only SANDBOX_FILE_TYPE_COMPOSE", req.GetType())
	}
	switch n := len(req.GetContents()); {
	case n == 0:
		add("contents", "is required (a Compose file)")
	case n > MaxContentsBytes:
		add("contents", "is %d bytes; at most %d (256 KiB)", n, MaxContentsBytes)
	}
	switch req.GetControl() {
	case sandboxv1.Control_CONTROL_UNSPECIFIED, sandboxv1.Control_CONTROL_PLATFORM:
	case sandboxv1.Control_CONTROL_CONTAINER_ENGINE:
		if req.GetPrimaryService() != "" {
			add("primary_service", "must be unset with control CONTROL_CONTAINER_ENGINE (the engine runs every service; the sandbox's one container is "+runtime.EngineContainerName+")")
		}
	default:
		add("control", "unknown control %v", req.GetControl())
	}
	if len(vs) > 0 {
		return Result{}, invalid(vs)
	}
	var unsupported []string
	if len(req.GetBuildContextObjects()) > 0 {
		unsupported = append(unsupported, "build contexts in object storage (build_context_objects)")
	}
	if len(req.GetImagePullCredentials()) > 0 {
		unsupported = append(unsupported, "image pull credentials")
	}

	refused, builds, err := checkKeys(req.GetContents())
	if err != nil {
		return Result{}, invalid([]apierr.Violation{{Field: "contents", Description: "not a Compose file: " + clipErr(err)}})
	}
	for _, r := range refused {
		add(r.field, "%s", r.description)
	}
	if len(vs) > 0 {
		return Result{}, invalid(vs)
	}
	project, err := load(ctx, req.GetContents())
	if err != nil {
		return Result{}, invalid([]apierr.Violation{{Field: "contents", Description: clipErr(err)}})
	}

	t := translator{req: req, project: project, builds: builds, add: add, toBuild: map[string]Build{}}
	var res Result
	if req.GetControl() == sandboxv1.Control_CONTROL_CONTAINER_ENGINE {
		res = t.translateEngine()
	} else {
		res = t.translate()
	}
	for _, k := range sortedNames(req.GetBuilderSizes()) {
		b, ok := t.toBuild[k]
		if !ok {
			add("builder_sizes["+clipKey(k)+"]", "service %q has nothing to build (no build: without an image)", clipKey(k))
			continue
		}
		b.BuilderSize = req.GetBuilderSizes()[k]
		t.toBuild[k] = b
	}
	for _, k := range sortedNames(req.GetBuildContexts()) {
		if _, ok := t.toBuild[k]; !ok {
			add("build_contexts["+clipKey(k)+"]", "service %q has nothing to build (no service of that name with build: and no image)", clipKey(k))
		}
	}
	if len(t.toBuild) > 0 {
		res.Builds = t.toBuild
	}
	if len(vs) > 0 {
		return Result{}, invalid(vs)
	}
	if len(unsupported) > 0 {
		return Result{}, apierr.Newf(apierr.NotImplemented, "not supported by this sandboxd yet: %s", strings.Join(unsupported, ", "))
	}
	return res, nil
}

func invalid(vs []apierr.Violation) error {
	return apierr.Invalid(apierr.InvalidRequest, "invalid Compose file: "+apierr.Describe(vs), vs)
}

// clipErr bounds a parser's message (it may quote the caller's text).
func clipErr(err error) string { return textclip.Clip(err.Error(), 512) }

// errUnset refuses a variable the file gives no default: the server's environment is
// never read, so it could only become an empty string the author did not write.
var errUnset = errors.New("is not set and has no default (the server's environment is never read; write ${VAR:-default})")

// load parses contents with compose-go: no file, no environment, no include or extends.
func load(ctx context.Context, contents []byte) (*types.Project, error) {
	details := types.ConfigDetails{
		WorkingDir:  "/",
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: contents}},
		Environment: types.Mapping{},
	}
	substitute := func(s string, m template.Mapping) (string, error) {
		return template.SubstituteWithOptions(s, m, template.WithoutLogging,
			template.WithReplacementFunction(func(sub string, m template.Mapping, cfg *template.Config) (string, error) {
				v, applied, err := template.DefaultReplacementAppliedFunc(sub, m, cfg)
				if err == nil && !applied {
					return "", fmt.Errorf("variable in %q %w", clipKey(sub), errUnset)
				}
				return v, err
			}))
	}
	return loader.LoadWithContext(ctx, details, func(o *loader.Options) {
		o.SetProjectName(projectName, true)
		o.SkipInclude = true
		o.SkipExtends = true
		o.SkipResolveEnvironment = true
		o.ResolvePaths = false
		o.ResourceLoaders = nil
		o.Interpolate.LookupValue = func(string) (string, bool) { return "", false }
		o.Interpolate.Substitute = substitute
		o.MaxNodeVisits = 100_000
	})
}

// dnsLabel is an RFC 1123 label: a container name (and so a service name here).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

type translator struct {
	req     *sandboxv1.CreateSandboxFromFileRequest
	project *types.Project
	builds  map[string]any // the build sections as written
	add     func(field, format string, args ...any)
	toBuild map[string]Build
	ports   map[int32]string // port -> the service that declares it
}

// baseSpec is the sandbox spec of the request's options, without containers.
func (t *translator) baseSpec() *sandboxv1.SandboxSpec {
	req := t.req
	return &sandboxv1.SandboxSpec{
		MaxLifetimeSeconds:  req.GetMaxLifetimeSeconds(),
		Tags:                req.GetTags(),
		Network:             req.GetNetwork(),
		NetworkIds:          req.GetNetworkIds(),
		ObjectStorageAccess: req.GetObjectStorageAccess(),
		Annotations:         req.GetAnnotations(),
		RunnerIds:           req.GetRunnerIds(),
		Mode:                req.GetMode(),
	}
}

func (t *translator) translate() Result {
	req := t.req
	spec := t.baseSpec()
	extra := Extra{DependsOn: map[string][]runtime.Dependency{}, Tmpfs: map[string][]string{}}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range t.project.Services {
			if !yield(n) {
				return
			}
		}
	})
	for k := range req.GetImageOverrides() {
		if _, ok := t.project.Services[k]; !ok {
			t.add("image_overrides["+clipKey(k)+"]", "no service %q in the file", clipKey(k))
		}
	}
	primary := req.GetPrimaryService()
	switch {
	case len(names) == 0:
		t.add("contents", "the file declares no service")
	case primary == "" && len(names) == 1:
		primary = names[0]
	case primary == "":
		t.add("primary_service", "is required: the file has %d services (%s)", len(names), strings.Join(names, ", "))
	default:
		if _, ok := t.project.Services[primary]; !ok {
			t.add("primary_service", "no service %q in the file (it has %s)", clipKey(primary), strings.Join(names, ", "))
		}
	}
	extra.Primary = primary
	// The primary first (so readers that take the first container agree), then the
	// others by name.
	if i := slices.Index(names, primary); i > 0 {
		names = append([]string{primary}, slices.Delete(names, i, i+1)...)
	}
	t.ports = map[int32]string{}
	volumes := map[string]bool{}
	for _, name := range names {
		svc := t.project.Services[name]
		f := "services." + name
		if !dnsLabel.MatchString(name) {
			t.add(f, "a service name is a container name and a host name here: lowercase letters, digits and '-' (at most 63), got %q", clipKey(name))
		}
		c, deps, tmpfs, vols := t.service(f, name, svc)
		if name == primary {
			c.Primary = proto.Bool(true)
		}
		spec.Containers = append(spec.Containers, c)
		if len(deps) > 0 {
			extra.DependsOn[name] = deps
		}
		if len(tmpfs) > 0 {
			extra.Tmpfs[name] = tmpfs
		}
		for _, v := range vols {
			volumes[v] = true
		}
		extra.HostAliases = append(extra.HostAliases, name)
	}
	for _, v := range sortedNames(volumes) {
		if _, ok := t.project.Volumes[v]; !ok {
			continue // compose-go refuses an undeclared volume; kept for safety
		}
		if !dnsLabel.MatchString(v) {
			t.add("volumes."+v, "a volume name here is a lowercase DNS label (a-z, 0-9, '-', at most 63)")
		}
		spec.Volumes = append(spec.Volumes, &sandboxv1.SandboxVolume{Name: v})
	}
	for _, v := range sortedNames(t.project.Volumes) {
		if !volumes[v] {
			t.add("volumes."+v, "is declared but no service mounts it")
		}
	}
	for _, p := range sortedPorts(t.ports) {
		spec.Services = append(spec.Services, &sandboxv1.Service{Port: p})
	}
	return Result{Spec: spec, Extra: extra}
}

func sortedPorts(m map[int32]string) []int32 {
	ps := make([]int32, 0, len(m))
	for p := range m {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// service translates one service (field f): its container, dependencies, tmpfs paths and
// the named volumes it mounts.
func (t *translator) service(f, name string, svc types.ServiceConfig) (*sandboxv1.Container, []runtime.Dependency, []string, []string) {
	c := &sandboxv1.Container{Name: name, Image: svc.Image, WorkingDir: svc.WorkingDir}
	if o, ok := t.req.GetImageOverrides()[name]; ok {
		c.Image = o
	}
	if strings.TrimSpace(c.Image) == "" {
		if t.hasBuild(name) {
			t.build(f+".build", name, svc.Build)
		} else {
			t.add(f+".image", "is required (or set image_overrides[%s])", name)
		}
	}
	// The wire's command is one executable: the entrypoint's first word, the rest of the
	// entrypoint and the command its arguments. Without an entrypoint the command
	// replaces the image's cmd and keeps its entrypoint, as in Compose.
	if len(svc.Entrypoint) > 0 {
		c.Command, c.Args = svc.Entrypoint[0], append(slices.Clone([]string(svc.Entrypoint[1:])), svc.Command...)
	} else if len(svc.Command) > 0 {
		c.Args = slices.Clone([]string(svc.Command))
	}
	if len(svc.Environment) > 0 {
		c.EnvironmentVariables = map[string]string{}
		for k, v := range svc.Environment {
			if v == nil {
				t.add(f+".environment."+clipKey(k), "has no value: the server's environment is never read")
				continue
			}
			c.EnvironmentVariables[k] = *v
		}
	}
	t.servicePorts(f, name, svc)
	c.StartupProbe = t.healthcheck(f+".healthcheck", svc.HealthCheck)
	c.SecurityContext = t.user(f+".user", svc.User)
	c.ResourceRequirements = t.resources(f+".deploy.resources", svc.Deploy)

	var deps []runtime.Dependency
	for _, dep := range sortedNames(svc.DependsOn) {
		d := svc.DependsOn[dep]
		df := f + ".depends_on." + dep
		if !d.Required {
			t.add(df+".required", "must be true: every service of the file runs")
		}
		var cond string
		switch d.Condition {
		case types.ServiceConditionStarted, "":
			cond = runtime.ConditionStarted
		case types.ServiceConditionHealthy:
			cond = runtime.ConditionHealthy
			if hc := t.project.Services[dep].HealthCheck; hc == nil || hc.Disable || len(hc.Test) == 0 || hc.Test[0] == "NONE" {
				t.add(df+".condition", "service_healthy needs a healthcheck on %s", dep)
			}
		case types.ServiceConditionCompletedSuccessfully:
			cond = runtime.ConditionCompleted
		default:
			t.add(df+".condition", "unknown condition %q (service_started, service_healthy, service_completed_successfully)", clipKey(d.Condition))
		}
		deps = append(deps, runtime.Dependency{Container: dep, Condition: cond})
	}

	var tmpfs, vols []string
	for _, p := range svc.Tmpfs {
		if err := runtime.CheckMountPath(p); err != nil {
			t.add(f+".tmpfs", "%v (tmpfs options are not supported: a path only)", err)
			continue
		}
		tmpfs = append(tmpfs, p)
	}
	for i, v := range svc.Volumes {
		vf := fmt.Sprintf("%s.volumes[%d]", f, i)
		switch v.Type {
		case types.VolumeTypeVolume:
			if v.Source == "" {
				t.add(vf, "anonymous volumes are not supported: name the volume (and declare it under volumes) or use tmpfs")
				continue
			}
			m := &sandboxv1.VolumeMount{Volume: v.Source, MountPath: v.Target, ReadOnly: v.ReadOnly}
			if v.Volume != nil {
				m.SubPath = v.Volume.Subpath
			}
			c.VolumeMounts = append(c.VolumeMounts, m)
			vols = append(vols, v.Source)
		case types.VolumeTypeTmpfs:
			if err := runtime.CheckMountPath(v.Target); err != nil {
				t.add(vf+".target", "%v", err)
				continue
			}
			tmpfs = append(tmpfs, v.Target)
		case types.VolumeTypeBind:
			t.add(vf, bindRefused)
		default:
			t.add(vf+".type", "volume type %q is not supported (volume, tmpfs)", clipKey(v.Type))
		}
	}
	return c, deps, tmpfs, vols
}

// servicePorts records the ports svc declares (expose and ports) as sandbox services.
// The services of a sandbox share its network, so one port is one service's.
func (t *translator) servicePorts(f, name string, svc types.ServiceConfig) {
	claim := func(field string, port int64) {
		if port < 1 || port > 65535 {
			t.add(field, "port %d is out of range 1-65535", port)
			return
		}
		p := int32(port)
		if other, ok := t.ports[p]; ok && other != name {
			t.add(field, "port %d is also declared by service %s: the services of a sandbox share its network", p, other)
			return
		}
		t.ports[p] = name
	}
	for i, e := range svc.Expose {
		ef := fmt.Sprintf("%s.expose[%d]", f, i)
		num, proto, _ := strings.Cut(e, "/")
		if proto != "" && proto != "tcp" {
			t.add(ef, "only TCP ports are supported, got %q", clipKey(e))
			continue
		}
		n, err := strconv.ParseInt(num, 10, 32)
		if err != nil {
			t.add(ef, "want one port number (no ranges), got %q", clipKey(e))
			continue
		}
		claim(ef, n)
	}
	for i, p := range svc.Ports {
		pf := fmt.Sprintf("%s.ports[%d]", f, i)
		if p.Protocol != "" && p.Protocol != "tcp" {
			t.add(pf+".protocol", "only TCP ports are supported, got %q", clipKey(p.Protocol))
			continue
		}
		if p.HostIP != "" || p.Mode != "" && p.Mode != "ingress" || p.AppProtocol != "" {
			t.add(pf, "host_ip, mode and app_protocol are not supported")
			continue
		}
		if p.Published != "" && p.Published != strconv.Itoa(int(p.Target)) {
			t.add(pf+".published", "a sandbox has no host ports to publish on: publish a port as itself (%d) or give the container port only", p.Target)
			continue
		}
		claim(pf, int64(p.Target))
	}
}

// healthcheck is a Compose healthcheck as a startup probe: the sandbox is RUNNING once it
// passes, and services that depend on it with service_healthy start then. Unset timings
// take the probe defaults (1 s period and timeout, 30 failures), not Compose's 30 s.
func (t *translator) healthcheck(f string, hc *types.HealthCheckConfig) *sandboxv1.Probe {
	if hc == nil || hc.Disable || len(hc.Test) == 0 {
		return nil
	}
	p := &sandboxv1.Probe{}
	switch hc.Test[0] {
	case "NONE":
		return nil
	case "CMD":
		p.Exec = slices.Clone([]string(hc.Test[1:]))
	case "CMD-SHELL":
		p.Exec = []string{"/bin/sh", "-c", strings.Join(hc.Test[1:], " ")}
	default:
		t.add(f+".test", "must start with CMD, CMD-SHELL or NONE, got %q", clipKey(hc.Test[0]))
		return nil
	}
	if len(p.Exec) == 0 || p.Exec[0] == "" {
		t.add(f+".test", "has no command")
	}
	seconds := func(field string, d *types.Duration) int32 {
		if d == nil {
			return 0
		}
		s := math.Ceil(time.Duration(*d).Seconds())
		if s < 0 || s > 3600 {
			t.add(field, "must be between 0 and 1h, got %v", time.Duration(*d))
			return 0
		}
		return int32(s)
	}
	p.PeriodSeconds = seconds(f+".interval", hc.Interval)
	p.TimeoutSeconds = seconds(f+".timeout", hc.Timeout)
	p.InitialDelaySeconds = seconds(f+".start_period", hc.StartPeriod)
	if hc.Retries != nil {
		if *hc.Retries > 1000 {
			t.add(f+".retries", "must be at most 1000, got %d", *hc.Retries)
		} else {
			p.FailureThreshold = int32(*hc.Retries)
		}
	}
	return p
}

// user maps a numeric uid[:gid]; a user name would need the image's /etc/passwd, which
// the gateway never reads, so it is refused.
func (t *translator) user(f, user string) *sandboxv1.SecurityContext {
	if user == "" {
		return nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	uid, err := strconv.ParseUint(u, 10, 32)
	if err != nil {
		t.add(f, "want a numeric uid[:gid] (a user name cannot be resolved before the image runs), got %q", clipKey(user))
		return nil
	}
	sc := &sandboxv1.SecurityContext{RunAsUser: proto.Uint32(uint32(uid))}
	if hasGroup {
		gid, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			t.add(f, "want a numeric uid[:gid] (a group name cannot be resolved before the image runs), got %q", clipKey(user))
			return nil
		}
		sc.RunAsGroup = proto.Uint32(uint32(gid))
	}
	return sc
}

// resources maps deploy.resources (limits, reservations as requests), else the request's
// default_resources.
func (t *translator) resources(f string, d *types.DeployConfig) *sandboxv1.ResourceRequirements {
	if d == nil || d.Resources.Limits == nil && d.Resources.Reservations == nil {
		if dr := t.req.GetDefaultResources(); dr != nil {
			return proto.CloneOf(dr)
		}
		return nil
	}
	one := func(f string, r *types.Resource) *sandboxv1.Resources {
		if r == nil {
			return nil
		}
		out := &sandboxv1.Resources{}
		if r.NanoCPUs != 0 {
			if r.NanoCPUs < 0 || r.NanoCPUs > 1e6 {
				t.add(f+".cpus", "out of range, got %v", r.NanoCPUs)
			} else {
				out.Cpu = strconv.FormatInt(int64(math.Round(float64(r.NanoCPUs)*1000)), 10) + "m"
			}
		}
		if r.MemoryBytes != 0 {
			if r.MemoryBytes < 0 {
				t.add(f+".memory", "must be positive")
			} else {
				out.Memory = strconv.FormatInt(int64(r.MemoryBytes), 10)
			}
		}
		return out
	}
	return &sandboxv1.ResourceRequirements{Limits: one(f+".limits", d.Resources.Limits), Requests: one(f+".reservations", d.Resources.Reservations)}
}
