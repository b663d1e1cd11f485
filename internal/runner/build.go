package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/distribution/reference"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// BuildRuntimeClass is the runtime class builders run under: gVisor. Buildah's chroot
// isolation makes user and mount namespaces inside the builder, which under runc would
// be the host kernel's (docs/builds.md), so no other class is accepted.
const BuildRuntimeClass = "gvisor"

// Bounds of one build on the runner.
const (
	DefaultBuildTimeout = 30 * time.Minute
	MaxBuildTimeout     = 2 * time.Hour
	// MaxBaseArchiveBytes bounds each base image's docker-archive on the host (they sit
	// in a temp dir until handed in).
	MaxBaseArchiveBytes = 4 << 30
	// MaxOrganizationIDBytes bounds BuildRequest.OrganizationID (it only ever names a
	// cache through its hash, never as a path).
	MaxOrganizationIDBytes = 256
	// builderTeardown bounds the wait for a deleted builder's teardown.
	builderTeardown = 2 * time.Minute
)

// BaseArchiver writes an image as a docker-archive of at most limit bytes through the
// runner's image store (its registry guard, credentials, mirrors): local.ImageArchiver's
// shape, which the stack's image adapter implements.
type BaseArchiver interface {
	WriteArchive(ctx context.Context, ref string, creds *runtime.Credentials, w io.Writer, limit int64) error
}

// BuildRequest is one image build (sandboxd.build.v1.StartBuild, as the gateway placed
// it on this runner).
type BuildRequest struct {
	imagebuild.Options
	// OrganizationID is the organization the build is for: its layer cache is that
	// organization's (never another's). Required.
	OrganizationID string
	// Context is the build context, an fsarchive archive, and its unpacked bounds.
	Context       io.Reader
	ContextLimits runtime.ArchiveLimits
	// BaseCredentials pull the base images of BaseCredentialsRegistry (the platform
	// registry's pull token for the organization's images); every other base image is
	// pulled with nil (the store's own auth: its configured credentials, its mirrors), so
	// a Dockerfile's FROM naming another registry never receives them (baseCredentials).
	BaseCredentials *runtime.Credentials
	// BaseCredentialsRegistry is the host[:port] BaseCredentials are for, as
	// distribution/reference names a reference's domain (the port counts). Required with
	// BaseCredentials.
	BaseCredentialsRegistry string
	// Push is the tag the image goes to, with the push token the gateway minted.
	Push                       string
	PushUsername, PushPassword string
	PushInsecure               bool
	Resources                  runtime.Resources
	Timeout                    time.Duration // 0 = DefaultBuildTimeout
	// OutputLimits bound the OCI layout read back; zero = 4 GiB, 100000 entries.
	OutputLimits runtime.ArchiveLimits
}

// BuildResult is a build's outcome: a failed build (ExitCode != 0) is a result, not an
// error.
type BuildResult struct {
	*imagebuild.Result
	Digest string // the pushed manifest's digest (succeeded builds)
}

// buildUnavailable is "" when the runner can build images, else why not.
func (l *Local) buildUnavailable() string {
	switch {
	case l.BuilderImage == "":
		return "it has no builder image (runner flag --builder-image)"
	case !slices.Contains(l.Classes(), BuildRuntimeClass):
		return fmt.Sprintf("it does not offer the runtime class %q builds run under (%v)", BuildRuntimeClass, l.Classes())
	case l.BuildImages == nil:
		return "its backend cannot hand base images to a builder"
	}
	return ""
}

// Build runs one image build in a builder sandbox of its own (the builder image, the
// gvisor class, default capabilities, the runner's BuildEgress only: base images are
// handed in; the organization's layer cache mounted at BuildCacheMount, one build of an
// organization at a time), pushes the result and destroys the builder, whatever
// happened. emit receives the build's output as it goes.
func (l *Local) Build(ctx context.Context, req BuildRequest, emit func(imagebuild.Event)) (*BuildResult, error) {
	if why := l.buildUnavailable(); why != "" {
		return nil, apierr.New(apierr.BuildNotSupported, fmt.Sprintf("runner %s builds no images: %s", l.RunnerID, why),
			map[string]string{"runner_id": l.RunnerID})
	}
	var vs []apierr.Violation
	for _, v := range req.Options.Check() {
		vs = append(vs, apierr.Violation{Field: v.Field, Description: v.Description})
	}
	switch {
	case req.Timeout < 0 || req.Timeout > MaxBuildTimeout:
		vs = append(vs, apierr.Violation{Field: "timeout_seconds", Description: fmt.Sprintf("%s: want (0, %s]", req.Timeout, MaxBuildTimeout)})
	case req.Push == "":
		vs = append(vs, apierr.Violation{Field: "push", Description: "is required"})
	case req.Context == nil:
		vs = append(vs, apierr.Violation{Field: "context", Description: "is required"})
	case req.OrganizationID == "" || len(req.OrganizationID) > MaxOrganizationIDBytes:
		vs = append(vs, apierr.Violation{Field: "organization_id", Description: fmt.Sprintf("is required, at most %d bytes (the organization whose layer cache the build uses)", MaxOrganizationIDBytes)})
	case req.BaseCredentials != nil && req.BaseCredentialsRegistry == "":
		vs = append(vs, apierr.Violation{Field: "base_credentials_registry", Description: "is required with base_credentials (the registry host they are for)"})
	}
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid build: "+apierr.Describe(vs), vs)
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = DefaultBuildTimeout
	}
	out := req.OutputLimits
	if out == (runtime.ArchiveLimits{}) {
		out = runtime.ArchiveLimits{MaxBytes: 4 << 30, MaxFiles: 100000}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var full atomic.Bool // the build hit the cache's quota
	events := func(ev imagebuild.Event) {
		if ev.Step == nil && strings.Contains(strings.ToLower(ev.Line), "disk quota exceeded") {
			full.Store(true)
		}
		if emit != nil {
			emit(ev)
		}
	}
	say := func(line string) {
		if emit != nil {
			emit(imagebuild.Event{Stream: imagebuild.System, Line: line})
		}
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := "build-" + hex.EncodeToString(b[:])
	spec := runtime.Spec{
		ID: id, RuntimeClass: BuildRuntimeClass,
		Container: runtime.Container{Image: l.BuilderImage, Command: "sleep", Args: []string{"infinity"}, Resources: req.Resources},
		Network:   &runtime.Network{DenyEgress: true},
	}
	if len(l.BuildEgress) > 0 {
		spec.Network = &runtime.Network{Egress: slices.Clone(l.BuildEgress)}
	}
	// The organization's layer cache, one build at a time (buildcache.go).
	if kv, size, why := l.buildCache(); why != "" {
		say("no layer cache: " + why)
	} else {
		name := BuildCacheName(req.OrganizationID)
		unlock, err := l.buildLocks.lock(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("waiting for the organization's layer cache (another build of it runs on runner %s): %w", l.RunnerID, err)
		}
		// Released after the builder is gone (deferred before its Delete, so run after).
		defer unlock()
		// A builder of the organization still live holds the lock no more: one left by
		// an earlier runner process. Two builders must never share a cache (Buildah's
		// storage locks are each sandbox's own), so it goes first.
		l.endOrphanBuilders(name)
		if err := l.evictBuildCaches(kv, name); err != nil {
			say("layer caches: " + err.Error())
		}
		// A cache that filled its quota fails every build: the failing one empties it.
		defer func() {
			if full.Load() {
				if err := kv.RemoveKept(name); err != nil {
					say("layer cache full, not emptied: " + err.Error())
				} else {
					say("layer cache full (" + strconv.FormatInt(size, 10) + " bytes): emptied for the next build")
				}
			}
		}()
		spec.Volumes = []runtime.Volume{{Name: "layer-cache", SizeBytes: size, Keep: name}}
		spec.VolumeMounts = []runtime.VolumeMount{{Volume: "layer-cache", Path: BuildCacheMount}}
	}
	var keep map[string]string
	for _, v := range spec.Volumes {
		if v.Keep != "" {
			keep = map[string]string{v.Name: v.Keep}
		}
	}
	if _, err := l.R.create(ctx, CreateRequest{Lifetime: timeout + time.Minute, Spec: spec}, keep); err != nil {
		return nil, fmt.Errorf("create the builder: %w", err)
	}
	defer func() {
		// Gone before the cache's lock is let go: the next build claims the cache.
		_, _ = l.R.Delete(id, 0)
		wctx, cancel := context.WithTimeout(context.Background(), builderTeardown)
		defer cancel()
		_, _ = l.R.WaitTerminal(wctx, id)
	}()
	agent, err := l.R.Agent(ctx, id, "")
	if err != nil {
		return nil, fmt.Errorf("the builder: %w", err)
	}
	tmp, err := os.MkdirTemp("", "sandboxd-build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	res, err := imagebuild.Run(ctx, agent, imagebuild.Input{Options: req.Options,
		Context: req.Context, ContextLimits: req.ContextLimits,
		WriteBase: l.writeBase(&req),
		OutDir:    filepath.Join(tmp, "out"), OutputLimits: out, Events: events,
	})
	if err != nil {
		return nil, err
	}
	br := &BuildResult{Result: res}
	if res.ExitCode != 0 {
		return br, nil
	}
	if br.Digest, err = imagebuild.Push(ctx, res.Image, req.Push, req.PushUsername, req.PushPassword, req.PushInsecure); err != nil {
		return nil, err
	}
	return br, nil
}

// writeBase is the build's imagebuild.Input.WriteBase: the runner's image store writes
// each base image, with req's credentials for the platform registry's bases only.
func (l *Local) writeBase(req *BuildRequest) func(ctx context.Context, ref string, w io.Writer) error {
	return func(ctx context.Context, ref string, w io.Writer) error {
		return l.BuildImages.WriteArchive(ctx, ref, req.baseCredentials(ref), w, MaxBaseArchiveBytes)
	}
}

// baseCredentials are the credentials the base image ref (as the Dockerfile names it)
// is pulled with: BaseCredentials when ref's registry domain, normalized by
// distribution/reference (docker.io when it names none), is BaseCredentialsRegistry,
// port included; nil for any other registry or a reference that does not parse (the
// store refuses it anyway). A Dockerfile is untrusted: the organization's pull token
// goes to the platform registry only.
func (req *BuildRequest) baseCredentials(ref string) *runtime.Credentials {
	if req.BaseCredentials == nil || req.BaseCredentialsRegistry == "" {
		return nil
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil || reference.Domain(named) != req.BaseCredentialsRegistry {
		return nil
	}
	return req.BaseCredentials
}
