package gateway

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/registry"
)

// Image builds (sandboxd.build.v1.BuildService, docs/builds.md "API"). The service is
// not served yet: this file holds what StartBuild checks before it queues a build.

// Bounds of a StartBuild request.
const (
	// DefaultMaxBuildContextBytes bounds the context as sent (the fsarchive archive).
	DefaultMaxBuildContextBytes = 64 << 20
	// Unpacked bounds, enforced by the builder's agent.
	MaxBuildContextUnpackedBytes = 1 << 30
	MaxBuildContextFiles         = 100000
	MaxBuildTimeout              = 2 * time.Hour
)

// buildTag is what a repository target's tag may be (Distribution's tag grammar).
var buildTag = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// buildTarget is where a build's image goes: org's repository (registry.RepositoryName)
// and tag, and the template display name when the target is a template.
type buildTarget struct {
	Repository, Tag, Template string
}

// checkStartBuild validates req for org (maxContext: the configured bound of the
// context as sent) and returns its target, or INVALID_ARGUMENT CWSANDBOX_INVALID_REQUEST
// with every violation.
func checkStartBuild(org string, req *buildv1.StartBuildRequest, maxContext int) (buildTarget, error) {
	var vs []apierr.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	var t buildTarget
	switch target := req.GetTarget().(type) {
	case *buildv1.StartBuildRequest_Template:
		name := strings.TrimSpace(target.Template)
		if name == "" || len(name) > 255 {
			add("template", "a template display name of 1-255 bytes")
			break
		}
		repo, err := registry.RepositoryName(org, templateRepository(name))
		if err != nil {
			add("template", "%q makes no repository name: %v", name, err)
			break
		}
		t = buildTarget{Repository: repo, Tag: "latest", Template: name}
	case *buildv1.StartBuildRequest_Repository:
		name, tag, hasTag := strings.Cut(target.Repository, ":")
		if !hasTag {
			tag = "latest"
		}
		if !buildTag.MatchString(tag) {
			add("repository", "tag %q: want [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", imagebuild.Clip(tag, 64))
			break
		}
		repo, err := registry.RepositoryName(org, name)
		if err != nil {
			add("repository", "%v", err)
			break
		}
		t = buildTarget{Repository: repo, Tag: tag}
	default:
		add("target", "a template or a repository is required")
	}
	for _, v := range (imagebuild.Options{Dockerfile: req.GetDockerfile(), BuildArgs: req.GetBuildArgs(), Target: req.GetTargetStage()}).Check() {
		add(v.Field, "%s", v.Description)
	}
	switch n := len(req.GetContext()); {
	case n == 0:
		add("context", "is required (an fsarchive archive of the build context)")
	case n > maxContext:
		add("context", "%d bytes, at most %d", n, maxContext)
	}
	if s := req.GetTimeoutSeconds(); s < 0 || time.Duration(s)*time.Second > MaxBuildTimeout {
		add("timeout_seconds", "%d: want 0 (the default) to %d", s, int(MaxBuildTimeout/time.Second))
	}
	if len(req.GetRequestId()) > 128 {
		add("request_id", "at most 128 bytes")
	}
	if len(vs) > 0 {
		return buildTarget{}, apierr.Invalid(apierr.InvalidRequest, "invalid build: "+apierr.Describe(vs), vs)
	}
	return t, nil
}

// templateRepository is the repository name of a template's images: its display name
// lower-cased, every run of characters outside [a-z0-9] replaced by one '-', trimmed
// of '-' (empty: "template").
func templateRepository(displayName string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(displayName) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	s := strings.TrimRight(b.String(), "-")
	if len(s) > 128 {
		s = strings.TrimRight(s[:128], "-")
	}
	if s == "" {
		return "template"
	}
	return s
}
