package compose

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// engineProject is the Compose project name a container-engine sandbox's file runs as
// (a DNS-1123 label, as runtime.Engine.Project must be).
const engineProject = projectName

// translateEngine translates the file for control CONTROL_CONTAINER_ENGINE: the file runs
// under Docker Engine inside the sandbox, whose one container (runtime.EngineContainerName)
// runs the runner's engine image. The keys refused are the same as for platform control
// (checkKeys ran before), and the images are what the policy sees: each service's image
// (image_overrides applied) is in Engine.Images, which the runner pulls and hands to the
// engine, so the engine runs exactly the images the policy allowed (never pulls). The
// sandbox's services are the ports the file publishes (as themselves or elsewhere: the
// engine publishes them in the sandbox's network); default_resources are the engine's.
func (t *translator) translateEngine() Result {
	req := t.req
	spec := t.baseSpec()
	// Unnamed on the public wire, where the name is reserved to the platform (a caller's
	// container never takes it); Extra.Apply names it in the runtime spec.
	c := &sandboxv1.Container{}
	if dr := req.GetDefaultResources(); dr != nil {
		c.ResourceRequirements = dr
	}
	spec.Containers = []*sandboxv1.Container{c}

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
	if len(names) == 0 {
		t.add("contents", "the file declares no service")
	}
	ports := map[int32]string{}
	var images []string
	for _, name := range names {
		svc := t.project.Services[name]
		f := "services." + name
		if !dnsLabel.MatchString(name) {
			t.add(f, "a service name is a host name under the engine: lowercase letters, digits and '-' (at most 63), got %q", clipKey(name))
		}
		img := svc.Image
		if o, ok := req.GetImageOverrides()[name]; ok {
			img = o
			// The image replaces what the file would build (the gateway's built image,
			// handed in like any other): the engine builds nothing.
			svc.Build = nil
		}
		switch {
		case strings.TrimSpace(img) == "" && t.hasBuild(name):
			// Built by the platform's builder before the create (like under platform
			// control); the gateway then translates the file again with the built image
			// as this service's image_overrides entry.
			t.build(f+".build", name, svc.Build)
		case strings.TrimSpace(img) == "":
			t.add(f+".image", "is required (or set image_overrides[%s])", name)
		case strings.Contains(img, "@"):
			// The runner hands images to the engine as docker-archive tarballs, which keep
			// a name and tag but no registry digest: a digest could not be honoured.
			t.add(f+".image", "image %q is pinned by digest, which the engine cannot honour (its images are handed in by the runner, "+
				"by name and tag); name it by tag", clipKey(img))
		default:
			if !slices.Contains(images, img) {
				images = append(images, img)
			}
		}
		svc.Image = img
		svc.PullPolicy = "never" // the runner hands every image in
		t.project.Services[name] = svc
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
			n, err := strconv.ParseInt(p.Published, 10, 32)
			if err != nil || n < 1 || n > 65535 {
				t.add(pf+".published", "publish the port on one fixed port of the sandbox (e.g. \"%d:%d\"), got %q", p.Target, p.Target, clipKey(p.Published))
				continue
			}
			if other, ok := ports[int32(n)]; ok && other != name {
				t.add(pf+".published", "port %d is also published by service %s", n, other)
				continue
			}
			ports[int32(n)] = name
		}
	}
	for _, p := range sortedPorts(ports) {
		spec.Services = append(spec.Services, &sandboxv1.Service{Port: p})
	}
	if len(images) > runtime.MaxEngineImages {
		t.add("services", "the file uses %d images; at most %d", len(images), runtime.MaxEngineImages)
	}
	file, err := t.project.MarshalYAML()
	if err != nil {
		t.add("contents", "cannot be written for the engine: %s", clipErr(err))
	}
	// The engine's compose interpolates again: what is left of the caller's file after
	// interpolation here is literal, so every $ is written $$.
	file = bytes.ReplaceAll(file, []byte("$"), []byte("$$"))
	if len(file) > runtime.MaxEngineComposeBytes {
		t.add("contents", "is %d bytes once normalized for the engine; at most %d", len(file), runtime.MaxEngineComposeBytes)
	}
	e := &runtime.Engine{Compose: file, Project: engineProject, Images: images}
	return Result{Spec: spec, Extra: Extra{Primary: runtime.EngineContainerName, Engine: e}}
}
