package compose

import (
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
)

// buildKeys are the keys of a service's build section that sandboxd builds with.
var buildKeys = set("context", "dockerfile", "dockerfile_inline", "args", "target")

// Build is a service to build: the gateway builds its image (an image build in a builder
// sandbox, pushed to the platform registry) before it creates the sandbox.
type Build struct {
	// Dockerfile is the Dockerfile's text (build.dockerfile_inline). The build context
	// is empty: CreateSandboxFromFile's build_contexts (tar bytes) are not taken yet, and
	// the official client's run_from_file sends none.
	Dockerfile string
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
			t.add(f+"."+clipKey(k), "is not supported by sandboxd's builds (a build takes context, dockerfile_inline, args and target)")
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
	if strings.TrimSpace(b.DockerfileInline) == "" {
		ctx := b.Context
		if ctx == "" {
			ctx = "."
		}
		t.add("build_contexts["+clipKey(name)+"]", "service %q builds from context %q with a Dockerfile there, and this sandboxd takes no build context bytes "+
			"(the official client's run_from_file sends none): write the Dockerfile inline in the file (build: {dockerfile_inline: ...}), "+
			"which builds with an empty context, or set image: or image_overrides[%s]", clipKey(name), clipKey(ctx), clipKey(name))
		return
	}
	if b.Dockerfile != "" && b.Dockerfile != "Dockerfile" {
		t.add(f+".dockerfile", "is set with dockerfile_inline: set one of them")
	}
	out := Build{Dockerfile: b.DockerfileInline, Target: b.Target}
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
