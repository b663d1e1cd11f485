package gateway

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/compose"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A Compose service with build: and no image is built before the sandbox is created:
// one build per service through the BuildService's queue (start, its placement on a
// runner with a builder, its push to the platform registry, its log), into the
// organization's repository compose-<service>:<digest of the build's inputs> (the
// Dockerfile, the context, the args, the target). The build's request_id is derived from
// the same inputs (and the builder size), so a second create with an unchanged service
// answers the build already done (or waits for the one still running) instead of
// building again; a failed or cancelled one is built afresh. The container then runs
// the pushed image by digest. Any user of the organization may build this way (StartBuild
// itself needs SANDBOX_ADMIN): the build is part of the create the user may make.

// composeBuildRequestPrefix starts the request_id of a Compose service's build.
const composeBuildRequestPrefix = "compose-build-"

// composeBuildRequest is the build of service b: its StartBuildRequest (with its
// request_id) and nil, or the violations of its builder size and its context
// (maxContext: the bound of a build's context, as sent and as converted).
func composeBuildRequest(service string, b compose.Build, maxContext int) (*buildv1.StartBuildRequest, []apierr.Violation) {
	size := b.BuilderSize
	if _, ok := builderSizes[size]; size != "" && !ok {
		return nil, []apierr.Violation{{Field: "builder_sizes[" + imagebuild.Clip(service, 64) + "]",
			Description: fmt.Sprintf("%q: want small, medium or large (default %s)", imagebuild.Clip(size, 64), defaultBuilderSize)}}
	}
	ctxArchive, dockerfile, bad := composeContext(service, b, maxContext)
	if bad != nil {
		return nil, bad
	}
	// The context's digest is part of the inputs: a changed context builds again, an
	// unchanged one reuses the build.
	ctxSum := sha256.Sum256(ctxArchive)
	inputs := sha256.Sum256([]byte(digest("compose-build-inputs", &buildv1.StartBuildRequest{Dockerfile: dockerfile, Context: ctxSum[:],
		BuildArgs: b.Args, TargetStage: b.Target})))
	tag := hex.EncodeToString(inputs[:])[:32]
	m := &buildv1.StartBuildRequest{
		Target:     &buildv1.StartBuildRequest_Repository{Repository: "compose-" + templateRepository(service) + ":" + tag},
		Dockerfile: dockerfile, Context: ctxArchive, BuildArgs: b.Args, TargetStage: b.Target, BuilderSize: size,
	}
	full := sha256.Sum256([]byte(digest("compose-build", &buildv1.StartBuildRequest{Target: m.Target, Dockerfile: m.Dockerfile, Context: ctxSum[:],
		BuildArgs: m.BuildArgs, TargetStage: m.TargetStage, BuilderSize: m.BuilderSize})))
	m.RequestId = composeBuildRequestPrefix + hex.EncodeToString(full[:])
	return m, nil
}

// inlineDockerfileName is the name an inline Dockerfile takes in a context sent in
// build_contexts (then "-1", "-2", ... while the context has that name).
const inlineDockerfileName = ".sandboxd-inline.Dockerfile"

// composeContext is the build context of service b as an fsarchive archive and the
// Dockerfile's path in it, or the violations of build_contexts[service]. Without a
// context sent, the context holds only the inline Dockerfile. A context sent is a tar
// (plain or gzip), converted in memory within maxContext (fsarchive.ReadTar); its
// Dockerfile is b.DockerfilePath, a regular file in it, or the inline one, added under
// a name the context does not use.
func composeContext(service string, b compose.Build, maxContext int) ([]byte, string, []apierr.Violation) {
	field := "build_contexts[" + imagebuild.Clip(service, 64) + "]"
	bad := func(format string, args ...any) []apierr.Violation {
		return []apierr.Violation{{Field: field, Description: fmt.Sprintf(format, args...)}}
	}
	if b.Context == nil {
		var buf bytes.Buffer
		if err := fsarchive.WriteFiles(&buf, map[string][]byte{"Dockerfile": []byte(b.Dockerfile)}); err != nil {
			// One fixed, valid name: cannot fail.
			return nil, "", []apierr.Violation{{Field: "services." + service + ".build", Description: err.Error()}}
		}
		return buf.Bytes(), "Dockerfile", nil
	}
	if n := len(b.Context); n > maxContext {
		return nil, "", bad("%d bytes, at most %d", n, maxContext)
	}
	tree, err := fsarchive.ReadTar(bytes.NewReader(b.Context), fsarchive.TarLimits{MaxBytes: int64(maxContext), MaxEntries: MaxBuildContextFiles - 1})
	if err != nil {
		return nil, "", bad("a tar archive (plain or gzip) of the service's context: %v", err)
	}
	dockerfile := b.DockerfilePath
	if b.Dockerfile != "" {
		dockerfile = inlineDockerfileName
		for i := 1; tree.Lookup(dockerfile) != 0; i++ {
			dockerfile = fmt.Sprintf("%s-%d", inlineDockerfileName, i)
		}
		if err := tree.AddFile(dockerfile, []byte(b.Dockerfile)); err != nil {
			return nil, "", bad("adding the inline Dockerfile: %v", err)
		}
	} else {
		switch tree.Lookup(dockerfile) {
		case tar.TypeReg:
		case 0:
			return nil, "", bad("has no %q (the service's build.dockerfile, default Dockerfile)", imagebuild.Clip(dockerfile, 256))
		case tar.TypeDir:
			return nil, "", bad("%q (the service's build.dockerfile) is a directory", imagebuild.Clip(dockerfile, 256))
		default:
			return nil, "", bad("%q (the service's build.dockerfile) is a symlink: the Dockerfile must be a regular file", imagebuild.Clip(dockerfile, 256))
		}
	}
	out, err := tree.Archive()
	if err != nil {
		return nil, "", bad("%v", err)
	}
	if n := len(out); n > maxContext {
		return nil, "", bad("converted, %d bytes, at most %d", n, maxContext)
	}
	return out, dockerfile, nil
}

// composeBuilds builds res.Builds, sets each built service's image in res.Spec to the
// image pushed (by digest), and answers the builds by service. A build that fails fails
// the create: FAILED_PRECONDITION naming the service and the failing step (the build
// stays listed, with its log); nothing else is left behind.
func (s *Server) composeBuilds(ctx context.Context, res compose.Result) (builtImages, error) {
	services := slices.Sorted(func(yield func(string) bool) {
		for n := range res.Builds {
			if !yield(n) {
				return
			}
		}
	})
	reqs := map[string]*buildv1.StartBuildRequest{}
	var vs []apierr.Violation
	for _, svc := range services {
		m, bad := composeBuildRequest(svc, res.Builds[svc], s.builds.cfg.MaxContextBytes)
		vs = append(vs, bad...)
		reqs[svc] = m
	}
	if len(vs) > 0 {
		return builtImages{}, apierr.Invalid(apierr.InvalidRequest, "invalid build: "+apierr.Describe(vs), vs)
	}
	// The request is checked first: a bad context is INVALID_ARGUMENT wherever it is sent.
	if err := s.builds.canBuild(ctx, principal(ctx).Org); err != nil {
		return builtImages{}, withService(err, "building the image of a Compose service with build:")
	}
	ids := map[string]string{}
	for _, svc := range services {
		rec, err := s.builds.start(ctx, reqs[svc])
		if err == nil && (rec.GetState() == buildv1.BuildState_BUILD_STATE_FAILED || rec.GetState() == buildv1.BuildState_BUILD_STATE_CANCELLED) {
			// An earlier build of the same inputs failed: build again (its request_id
			// stays with the failed one).
			again := proto.CloneOf(reqs[svc])
			again.RequestId = ""
			rec, err = s.builds.start(ctx, again)
		}
		if err != nil {
			return builtImages{}, withService(err, fmt.Sprintf("service %q: start its build", svc))
		}
		ids[svc] = rec.GetBuildId()
	}
	images := map[string]string{}
	for _, svc := range services {
		rec, err := s.builds.wait(ctx, ids[svc])
		if err != nil {
			if ctx.Err() != nil {
				return builtImages{}, connect.NewError(connect.CodeDeadlineExceeded,
					fmt.Errorf("service %q: build %s did not end before the request did; it goes on: send the request again (same file) to use it", svc, ids[svc]))
			}
			return builtImages{}, withService(err, fmt.Sprintf("service %q: build %s", svc, ids[svc]))
		}
		if rec.GetState() != buildv1.BuildState_BUILD_STATE_SUCCEEDED {
			msg := rec.GetFailureMessage()
			if msg == "" {
				msg = strings.TrimPrefix(rec.GetState().String(), "BUILD_STATE_")
			}
			reason := apierr.BuildFailed
			if r := rec.GetFailureReason(); strings.HasPrefix(r, "CWSANDBOX_") {
				reason = r // the platform's (no runner builds, no room): its own code
			}
			return builtImages{}, apierr.New(reason, fmt.Sprintf("the image of service %q was not built (build %s): %s", svc, rec.GetBuildId(), msg),
				map[string]string{"service": svc, "build_id": rec.GetBuildId(), "failure_reason": rec.GetFailureReason()})
		}
		images[svc] = rec.GetImage()
		if res.Extra.Engine != nil {
			// The engine is handed its images by name and tag (a docker-archive keeps no
			// registry digest): the build's own tag, which names its inputs.
			repo, _, _ := strings.Cut(rec.GetImage(), "@")
			_, tag, _ := strings.Cut(reqs[svc].GetRepository(), ":")
			if repo == "" || tag == "" {
				return builtImages{}, connect.NewError(connect.CodeInternal, fmt.Errorf("compose: build %s of service %q: no tag for image %q", rec.GetBuildId(), svc, rec.GetImage()))
			}
			images[svc] = repo + ":" + tag
		}
	}
	if res.Extra.Engine != nil {
		// Container-engine control: the caller translates the file again with these
		// images as image_overrides (engineBuilt).
		return builtImages{ids: ids, engine: images}, nil
	}
	for _, c := range res.Spec.GetContainers() {
		if img, ok := images[c.GetName()]; ok {
			c.Image = img
			delete(images, c.GetName())
		}
	}
	if len(images) > 0 {
		return builtImages{}, connect.NewError(connect.CodeInternal, fmt.Errorf("compose: the spec has no container for the built service(s) %v", images))
	}
	return builtImages{ids: ids}, nil
}

// builtImages are a Compose file's builds: their IDs by service and, under container-engine
// control, the images built by service (by tag), for engineBuilt.
type builtImages struct {
	ids    map[string]string
	engine map[string]string
}

// engineBuilt is req for a second translation once its services' images are built
// (container-engine control): each built service's image is its image_overrides entry,
// and what built it (its context, its builder size) is dropped from the request.
func engineBuilt(req *sandboxv1.CreateSandboxFromFileRequest, images map[string]string) *sandboxv1.CreateSandboxFromFileRequest {
	out := proto.CloneOf(req)
	if out.ImageOverrides == nil {
		out.ImageOverrides = map[string]string{}
	}
	for svc, img := range images {
		out.ImageOverrides[svc] = img
		delete(out.BuildContexts, svc)
		delete(out.BuildContextObjects, svc)
		delete(out.BuilderSizes, svc)
	}
	return out
}

// withService prefixes err's message with what, keeping its code and details.
func withService(err error, what string) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		out := connect.NewError(ce.Code(), fmt.Errorf("%s: %s", what, ce.Message()))
		for _, d := range ce.Details() {
			out.AddDetail(d)
		}
		return out
	}
	return fmt.Errorf("%s: %w", what, err)
}

// wait waits for build id of the caller's organization to end (woken by this gateway's
// finish, else reading the store each second) and answers its final record; ctx's end
// ends the wait, not the build.
func (bs *buildService) wait(ctx context.Context, id string) (*buildv1.Build, error) {
	org := principal(ctx).Org
	for {
		var done chan struct{}
		bs.mu.Lock()
		if lb, ok := bs.live[id]; ok && lb.org == org {
			done = lb.done
		}
		bs.mu.Unlock()
		if done == nil {
			b, err := bs.st.Get(ctx, org, id)
			switch {
			case errors.Is(err, store.ErrNotFound):
				return nil, buildNotFound(id)
			case err != nil:
				return nil, connect.NewError(connect.CodeUnavailable, err)
			}
			rec, err := decodeBuild(b)
			if err != nil {
				return nil, err
			}
			if terminalBuild(rec.GetState()) {
				return rec, nil
			}
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-done: // nil blocks: the timer polls
		case <-t.C:
		}
		t.Stop()
	}
}
