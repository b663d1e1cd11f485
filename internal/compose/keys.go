package compose

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/sandboxd/sandboxd/internal/textclip"
)

// The keys sandboxd translates. Every other key a file sets is refused with a field
// violation naming it: a Compose file means what it says, and a key silently dropped
// (privileged, a host bind mount, a network mode) would run something other than what
// its author wrote. x-* extension keys are Compose's own "ignore me" and are allowed.
var (
	topKeys     = set("version", "name", "services", "volumes", "networks")
	serviceKeys = set("image", "build", "command", "entrypoint", "environment", "working_dir", "expose", "ports",
		"depends_on", "healthcheck", "user", "volumes", "tmpfs", "deploy", "networks")
	healthcheckKeys = set("test", "interval", "timeout", "retries", "start_period", "disable")
	deployKeys      = set("resources")
	resourcesKeys   = set("limits", "reservations")
	resourceKeys    = set("cpus", "memory")
	dependsOnKeys   = set("condition", "required")
	portKeys        = set("target", "published", "protocol", "name")
	volumeKeys      = set("type", "source", "target", "read_only", "volume")
	volumeOptKeys   = set("subpath")
)

func set(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// checkKeys walks the raw documents of a Compose file and reports every key sandboxd does
// not translate, and the shapes that would make compose-go read the server's files or
// environment (env_file, extends, include, a variable-less environment entry, host bind
// mounts). It runs before compose-go sees the file, so nothing refused here is ever
// loaded. builds holds the build section of each service that has one, as written.
func checkKeys(contents []byte) (vs []violation, builds map[string]any, err error) {
	builds = map[string]any{}
	dec := yaml.NewDecoder(bytes.NewReader(contents))
	for {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		if doc == nil {
			continue
		}
		top, ok := asMap(doc)
		if !ok {
			return nil, nil, errors.New("a Compose file is a mapping at the top level")
		}
		vs = append(vs, unknownKeys("", top, topKeys)...)
		if v, ok := asMap(top["volumes"]); ok {
			for _, name := range sortedKeys(v) {
				if m, ok := asMap(v[name]); ok {
					vs = append(vs, unknownKeys("volumes."+name+".", m, nil)...)
				} else if v[name] != nil {
					vs = append(vs, violation{"volumes." + name, "a named volume takes no options here (it is a scratch volume of the sandbox)"})
				}
			}
		}
		if n, ok := asMap(top["networks"]); ok {
			for _, name := range sortedKeys(n) {
				if name != "default" || n[name] != nil {
					vs = append(vs, violation{"networks." + name, "the services of a sandbox share one network (localhost; each service name resolves to it): declare no networks"})
				}
			}
		}
		services, _ := asMap(top["services"])
		for _, name := range sortedKeys(services) {
			svc, ok := asMap(services[name])
			if !ok {
				continue // compose-go's schema reports it
			}
			vs = append(vs, checkService("services."+name, svc)...)
			if b, ok := svc["build"]; ok {
				builds[name] = b
			}
		}
	}
	return vs, builds, nil
}

func checkService(f string, svc map[string]any) []violation {
	vs := unknownKeys(f+".", svc, serviceKeys)
	if hc, ok := asMap(svc["healthcheck"]); ok {
		vs = append(vs, unknownKeys(f+".healthcheck.", hc, healthcheckKeys)...)
	}
	if d, ok := asMap(svc["deploy"]); ok {
		vs = append(vs, unknownKeys(f+".deploy.", d, deployKeys)...)
		if r, ok := asMap(d["resources"]); ok {
			vs = append(vs, unknownKeys(f+".deploy.resources.", r, resourcesKeys)...)
			for _, k := range []string{"limits", "reservations"} {
				if m, ok := asMap(r[k]); ok {
					vs = append(vs, unknownKeys(f+".deploy.resources."+k+".", m, resourceKeys)...)
				}
			}
		}
	}
	if deps, ok := asMap(svc["depends_on"]); ok {
		for _, dep := range sortedKeys(deps) {
			if m, ok := asMap(deps[dep]); ok {
				vs = append(vs, unknownKeys(f+".depends_on."+dep+".", m, dependsOnKeys)...)
			}
		}
	}
	if ports, ok := svc["ports"].([]any); ok {
		for i, p := range ports {
			if m, ok := asMap(p); ok {
				vs = append(vs, unknownKeys(fmt.Sprintf("%s.ports[%d].", f, i), m, portKeys)...)
			}
		}
	}
	if vols, ok := svc["volumes"].([]any); ok {
		for i, v := range vols {
			vf := fmt.Sprintf("%s.volumes[%d]", f, i)
			if m, ok := asMap(v); ok {
				vs = append(vs, unknownKeys(vf+".", m, volumeKeys)...)
				if o, ok := asMap(m["volume"]); ok {
					vs = append(vs, unknownKeys(vf+".volume.", o, volumeOptKeys)...)
				}
				if t, _ := m["type"].(string); t == "bind" {
					vs = append(vs, violation{vf, bindRefused})
				}
			} else if s, ok := v.(string); ok {
				if src, _, ok := strings.Cut(s, ":"); ok && !namedVolume(src) {
					vs = append(vs, violation{vf, bindRefused})
				}
			}
		}
	}
	if nets := svc["networks"]; nets != nil {
		ok := false
		if l, isList := nets.([]any); isList {
			ok = len(l) == 1 && l[0] == "default"
		} else if m, isMap := asMap(nets); isMap {
			ok = len(m) == 1 && m["default"] == nil && hasKey(m, "default")
		}
		if !ok {
			vs = append(vs, violation{f + ".networks", "the services of a sandbox share one network (localhost; each service name resolves to it): only the default network"})
		}
	}
	if env, ok := svc["environment"].([]any); ok {
		for i, e := range env {
			if s, ok := e.(string); ok && !strings.Contains(s, "=") {
				vs = append(vs, violation{fmt.Sprintf("%s.environment[%d]", f, i), fmt.Sprintf("%q has no value: the server's environment is never read (write %s=value)", clipKey(s), clipKey(s))})
			}
		}
	} else if env, ok := asMap(svc["environment"]); ok {
		for _, k := range sortedKeys(env) {
			if env[k] == nil {
				vs = append(vs, violation{f + ".environment." + k, "has no value: the server's environment is never read"})
			}
		}
	}
	return vs
}

const bindRefused = "host bind mounts are refused: a sandbox never sees the server's files (use a named volume)"

// namedVolume reports whether the source of a short volume entry names a volume (as
// Compose decides: a path, ~ or a variable is a host bind mount).
func namedVolume(src string) bool {
	return src != "" && !strings.ContainsAny(src[:1], "/.~$\\") && !strings.Contains(src, "/")
}

func hasKey(m map[string]any, k string) bool { _, ok := m[k]; return ok }

// unknownKeys reports the keys of m (field prefix p) not in allowed; x-* extensions pass.
func unknownKeys(p string, m map[string]any, allowed map[string]bool) []violation {
	var vs []violation
	for _, k := range sortedKeys(m) {
		if allowed[k] || strings.HasPrefix(k, "x-") {
			continue
		}
		vs = append(vs, violation{p + clipKey(k), refusal(k)})
	}
	return vs
}

// refusal says why key is refused: the keys a reader is most likely to try get a reason.
func refusal(key string) string {
	switch key {
	case "env_file", "label_file":
		return "is refused: the server never reads files named by a Compose file (write the variables under environment)"
	case "extends", "include":
		return "is refused: a Compose file sent to sandboxd must be self-contained"
	case "secrets", "configs":
		return "is refused: file- and environment-based secrets and configs would read the server's files or environment"
	case "privileged", "cap_add", "cap_drop", "devices", "pid", "ipc", "network_mode", "userns_mode", "security_opt", "sysctls", "cgroup_parent", "uts":
		return "is refused: sandboxes do not take host-level privileges or namespaces"
	case "profiles":
		return "is refused: every service of the file runs (no profiles)"
	}
	return "is not supported by sandboxd's Compose translation (see docs/api.md, Compose)"
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// clipKey bounds a caller's key in a message.
func clipKey(s string) string { return textclip.Clip(s, 64) }

// asMap is v as a mapping with string keys (YAML allows other keys; they are named by
// their text, as compose-go does).
func asMap(v any) (map[string]any, bool) {
	switch m := v.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprint(k)] = v
		}
		return out, true
	}
	return nil, false
}
