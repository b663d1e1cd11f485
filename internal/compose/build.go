package compose

import (
	"path"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
)

// buildKeys are the keys of a service's build section that sandboxd builds with.
var buildKeys = set("context", "dockerfile", "dockerfile_inline", "args", "target")

// Build is a service to build: the gateway builds its image (an image build in a builder
// sandbox, pushed to the platform registry) before it creates the sandbox.
type Build struct {
	// Dockerfile is the Dockerfile's text (build.dockerfile_inline), or "" when the
	// Dockerfile is in the context at DockerfilePath (build.dockerfile, default
	// "Dockerfile": a clean path relative to the context).
	Dockerfile     string
	DockerfilePath string
	// Context is build_contexts[service] as sent: a tar archive (plain or gzip) of the
	// service's context directory, which the gateway checks and converts
	// (fsarchive.ReadTar). nil: no context was sent; only an inline Dockerfile builds
	// then, with an empty context.
	Context []byte
	// Args are build.args (--build-arg), Target build.target (--target).
	Args   map[string]string
	Target string
	// BuilderSize is builder_sizes[service] as sent ("" the default); the gateway
	// checks it.
	BuilderSize string
}

func (t *translator) hasBuild(name string) bool {
	_, ok := t.builds[name]
	return ok
}

// build records service name's build section (field f) as a Build, or its violations.
func (t *translator) build(f, name string, b *types.BuildConfig) {
	raw, _ := asMap(t.builds[name])
	for _, k := range sortedKeys(raw) {
		if !buildKeys[k] && !strings.HasPrefix(k, "x-") {
			t.add(f+"."+clipKey(k), "is not supported by sandboxd's builds (a build takes context, dockerfile, dockerfile_inline, args and target)")
		}
	}
	// An arg without a value would take the server's environment (compose-go drops it
	// here): refused, like such an environment entry.
	switch args := raw["args"].(type) {
	case []any:
		for _, a := range args {
			if s, ok := a.(string); ok && !strings.Contains(s, "=") {
				t.add(f+".args."+clipKey(s), "has no value: the server's environment is never read")
			}
		}
	case map[string]any:
		for _, k := range sortedKeys(args) {
			if args[k] == nil {
				t.add(f+".args."+clipKey(k), "has no value: the server's environment is never read")
			}
		}
	}
	if b == nil {
		t.add(f, "is empty: write build: {dockerfile_inline: ...}")
		return
	}
	if remoteContext(b.Context) {
		t.add(f+".context", "%q is a remote context, which sandboxd does not fetch: send the directory as a tar in build_contexts[%s]", clipKey(b.Context), clipKey(name))
		return
	}
	tarBytes, hasTar := t.req.GetBuildContexts()[name]
	out := Build{Dockerfile: b.DockerfileInline, Target: b.Target, Context: tarBytes}
	if strings.TrimSpace(b.DockerfileInline) == "" {
		if !hasTar {
			ctx := b.Context
			if ctx == "" {
				ctx = "."
			}
			t.add("build_contexts["+clipKey(name)+"]", "service %q builds from context %q with a Dockerfile there: send that directory as a tar archive "+
				"(plain or gzip) in build_contexts[%s] (the official client's run_from_file sends none), write the Dockerfile "+
				"inline (build: {dockerfile_inline: ...}), which builds with an empty context, or set image: or image_overrides[%s]",
				clipKey(name), clipKey(ctx), clipKey(name), clipKey(name))
			return
		}
		df := b.Dockerfile
		if df == "" {
			df = "Dockerfile"
		}
		if why := contextPath(df); why != "" {
			t.add(f+".dockerfile", "%q: %s", clipKey(df), why)
			return
		}
		out.DockerfilePath = path.Clean(df)
	} else if b.Dockerfile != "" && b.Dockerfile != "Dockerfile" {
		t.add(f+".dockerfile", "is set with dockerfile_inline: set one of them")
	}
	if len(b.Args) > 0 {
		out.Args = map[string]string{}
		for k, v := range b.Args {
			if v == nil {
				t.add(f+".args."+clipKey(k), "has no value: the server's environment is never read")
				continue
			}
			out.Args[k] = *v
		}
	}
	t.toBuild[name] = out
}

// remoteContext tells a context Compose would fetch (a Git repository, a URL) from a
// directory.
func remoteContext(ctx string) bool {
	return strings.Contains(ctx, "://") || strings.HasPrefix(ctx, "git@") || strings.HasPrefix(ctx, "github.com/")
}

// contextPath is why p is not a path inside the context ("" when it is).
func contextPath(p string) string {
	switch {
	case len(p) > 1024:
		return "longer than 1024 bytes"
	case strings.ContainsRune(p, 0):
		return "a NUL byte"
	case path.IsAbs(p):
		return "an absolute path: write the Dockerfile's path relative to the context (it is looked up in build_contexts)"
	case path.Clean(p) == ".":
		return "names the context itself"
	}
	for el := range strings.SplitSeq(p, "/") {
		if el == ".." {
			return `a ".." element: the Dockerfile must be inside the context`
		}
	}
	return ""
}
