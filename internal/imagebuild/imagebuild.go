// Package imagebuild runs one image build inside a builder sandbox (docs/builds.md): the
// runner side of sandboxd.build.v1.BuildService, never importing the gateway. The caller
// (the runner) creates the builder sandbox (the builder image, the gvisor class, default
// capabilities) and hands Run a client of its agent; Run moves the context and the base
// images in through the agent's ExtractPath, runs Buildah (chroot isolation, vfs storage)
// by StreamExec with its output reported line by line and step by step, and reads the OCI
// layout Buildah wrote back through ArchivePath into a host directory, bounded. Push
// sends the result to a registry (the platform registry, with a push token the gateway
// minted). Nothing the sandbox writes is trusted: lines are clipped, steps bounded, the
// layout unpacked by fsarchive (no symlink followed, limits enforced while reading).
package imagebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Paths inside the builder sandbox.
const (
	dirBase = "/build/base" // base-N.tar (docker-archive) and base-N.ref (its name)
	dirCtx  = "/build/ctx"
	dirOut  = "/build/out" // the OCI layout
)

// script runs inside the builder: load each base image the host handed in (unless the
// store, the layer cache, has it), build, write the result as an OCI layout. Its
// arguments: the Dockerfile path, then Buildah's build options (never interpreted by
// the shell).
const script = `set -e
df=$1; shift
for f in ` + dirBase + `/*.tar; do
  [ -e "$f" ] || continue
  ref=$(cat "${f%.tar}.ref")
  [ -n "$(buildah images -q "$ref" 2>/dev/null)" ] || buildah pull -q "docker-archive:$f" >/dev/null
done
buildah bud --layers --isolation=chroot --pull=never -f "` + dirCtx + `/$df" -t localhost/built:1 "$@" ` + dirCtx + `
buildah push -q localhost/built:1 "oci:` + dirOut + `:latest" >/dev/null
`

// Bounds of a request (the gateway checks them before queueing; Run again).
const (
	MaxBuildArgs     = 64
	MaxBuildArgBytes = 4 << 10 // a name plus its value
	MaxPathBytes     = 1 << 10 // the Dockerfile path, the target stage
)

var (
	argName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	stageName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

// Violation is one bad field of a build request (apierr.Violation's shape; the gateway
// converts).
type Violation struct{ Field, Description string }

// Options are the caller's build options.
type Options struct {
	Dockerfile string            // relative path in the context; "" = "Dockerfile"
	BuildArgs  map[string]string // --build-arg
	Target     string            // --target stage; "" = the last
	NoCache    bool
}

// Check returns the violations of o (empty when o is valid).
func (o Options) Check() []Violation {
	var vs []Violation
	if o.Dockerfile != "" {
		if err := checkRelPath(o.Dockerfile); err != nil {
			vs = append(vs, Violation{"dockerfile", err.Error()})
		}
	}
	if len(o.BuildArgs) > MaxBuildArgs {
		vs = append(vs, Violation{"build_args", fmt.Sprintf("%d build args, at most %d", len(o.BuildArgs), MaxBuildArgs)})
	}
	for _, k := range sortedKeys(o.BuildArgs) {
		switch v := o.BuildArgs[k]; {
		case !argName.MatchString(k):
			vs = append(vs, Violation{"build_args", fmt.Sprintf("build arg name %q: want [A-Za-z_][A-Za-z0-9_]*", Clip(k, 64))})
		case len(k)+len(v) > MaxBuildArgBytes:
			vs = append(vs, Violation{"build_args", fmt.Sprintf("build arg %s: %d bytes, at most %d", k, len(k)+len(v), MaxBuildArgBytes)})
		case strings.ContainsRune(v, 0):
			vs = append(vs, Violation{"build_args", fmt.Sprintf("build arg %s: a NUL byte", k)})
		}
	}
	if o.Target != "" && (len(o.Target) > MaxPathBytes || !stageName.MatchString(o.Target)) {
		vs = append(vs, Violation{"target_stage", fmt.Sprintf("%q is not a stage name", Clip(o.Target, 64))})
	}
	return vs
}

func checkRelPath(p string) error {
	switch {
	case len(p) > MaxPathBytes:
		return fmt.Errorf("%d bytes, at most %d", len(p), MaxPathBytes)
	case strings.ContainsRune(p, 0):
		return errors.New("a NUL byte")
	case path.IsAbs(p):
		return fmt.Errorf("%q: want a path relative to the context", Clip(p, 64))
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return fmt.Errorf("%q: a \"..\" element", Clip(p, 64))
		}
	}
	if path.Clean(p) == "." {
		return fmt.Errorf("%q names the context itself", p)
	}
	return nil
}

func (o Options) dockerfile() string {
	if o.Dockerfile == "" {
		return "Dockerfile"
	}
	return path.Clean(o.Dockerfile)
}

// argv is the builder command for o (checked).
func (o Options) argv() []string {
	a := []string{"sh", "-c", script, "build", o.dockerfile()}
	for _, k := range sortedKeys(o.BuildArgs) {
		a = append(a, "--build-arg="+k+"="+o.BuildArgs[k])
	}
	if o.Target != "" {
		a = append(a, "--target="+o.Target)
	}
	if o.NoCache {
		a = append(a, "--no-cache")
	}
	return a
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Stream says where a log line came from.
type Stream int

const (
	Stdout Stream = iota + 1
	Stderr
	System // the runner's own lines
)

// Event is what Run reports as the build goes: a line of output or a step begun.
type Event struct {
	Step   *Step // a step began (Line is empty)
	Stream Stream
	InStep int    // the step a line belongs to (0: none yet)
	Line   string // at most MaxLine bytes, valid UTF-8
}

// Input is one build.
type Input struct {
	Options
	// Context is the build context as an fsarchive archive (what `sbx template build`
	// writes); the agent unpacks it inside the builder within ContextLimits.
	Context       io.Reader
	ContextLimits runtime.ArchiveLimits
	// WriteBase writes one of the Dockerfile's base images (Bases: read from the
	// Dockerfile once the context is in the builder), named as the Dockerfile writes it,
	// as a docker-archive tagged with that name: the runner's image store (the policy's
	// image rules, its registry guard, the caller's credentials, its mirrors, a size
	// bound). Credentials never enter the builder.
	WriteBase func(ctx context.Context, ref string, w io.Writer) error
	// OutDir is an empty host directory the OCI layout is unpacked into, within
	// OutputLimits.
	OutDir       string
	OutputLimits runtime.ArchiveLimits
	// Events receives the build's output (called from Run's goroutine, in order).
	Events func(Event)
}

// Result is a build's outcome. A build that ran and failed is a Result with ExitCode
// != 0 (and Failed naming the step when Buildah did), not an error.
type Result struct {
	ExitCode int32
	Steps    []Step
	Failed   *Step  // the failing step, when a step failed
	Why      string // Buildah's reason for it ("exit status 7")
	Image    v1.Image
	Bases    []string // the base images handed in
}

// Agent is what Run needs of the builder's agent.
type Agent interface {
	StreamExec(ctx context.Context) *connect.BidiStreamForClient[agentv1.StreamExecRequest, agentv1.StreamExecResponse]
	ArchivePath(ctx context.Context, req *connect.Request[agentv1.ArchivePathRequest]) (*connect.ServerStreamForClient[agentv1.ArchivePathResponse], error)
	ExtractPath(ctx context.Context) *connect.ClientStreamForClient[agentv1.ExtractPathRequest, agentv1.ExtractPathResponse]
	ReadFile(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error)
	Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error)
}

var _ Agent = agentv1connect.AgentServiceClient(nil)

// Run builds in the builder whose agent is a. The caller destroys the builder after.
func Run(ctx context.Context, a Agent, in Input) (*Result, error) {
	if vs := in.Options.Check(); len(vs) > 0 {
		return nil, fmt.Errorf("build options: %s: %s", vs[0].Field, vs[0].Description)
	}
	emit := in.Events
	if emit == nil {
		emit = func(Event) {}
	}
	if err := prepare(ctx, a); err != nil {
		return nil, err
	}
	emit(Event{Stream: System, Line: "sending the build context"})
	if _, err := extract(ctx, a, dirCtx, in.Context, in.ContextLimits); err != nil {
		return nil, fmt.Errorf("the build context: %w", err)
	}
	df, err := a.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: dirCtx + "/" + in.Options.dockerfile(), MaxBytes: MaxDockerfileBytes}))
	if err != nil {
		return nil, fmt.Errorf("the Dockerfile %s: %w", in.Options.dockerfile(), err)
	}
	bases, err := Bases(df.Msg.Content, in.BuildArgs)
	if err != nil {
		return nil, err
	}
	if err := sendBases(ctx, a, bases, in.WriteBase, emit); err != nil {
		return nil, err
	}
	res, err := execBuild(ctx, a, in.Options.argv(), emit)
	if err != nil {
		return nil, err
	}
	res.Bases = bases
	if res.ExitCode != 0 {
		return res, nil
	}
	emit(Event{Stream: System, Line: "reading the built image"})
	if res.Image, err = readLayout(ctx, a, in.OutDir, in.OutputLimits); err != nil {
		return nil, err
	}
	return res, nil
}

// prepare empties /build (a builder may build more than once; its layer cache is
// elsewhere) and makes the directories ExtractPath fills.
func prepare(ctx context.Context, a Agent) error {
	resp, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{
		Command:        []string{"sh", "-c", `rm -rf /build && mkdir -p "$@"`, "prepare", dirBase, dirCtx},
		MaxOutputBytes: 4096,
	}))
	if err != nil {
		return fmt.Errorf("prepare the builder: %w", err)
	}
	if resp.Msg.ExitCode != 0 {
		return fmt.Errorf("prepare the builder: exit %d: %s", resp.Msg.ExitCode, Clip(string(resp.Msg.Stderr), 512))
	}
	return nil
}

// sendBases writes each base image as a docker-archive (base-N.tar, its name in
// base-N.ref) into a host temp dir and sends the dir to the builder.
func sendBases(ctx context.Context, a Agent, bases []string, write func(context.Context, string, io.Writer) error, emit func(Event)) error {
	if len(bases) == 0 {
		return nil
	}
	if write == nil {
		return errors.New("base images named but no WriteBase")
	}
	tmp, err := os.MkdirTemp("", "sandboxd-build-base-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for i, n := range bases {
		emit(Event{Stream: System, Line: "base image " + n})
		f := filepath.Join(tmp, "base-"+strconv.Itoa(i))
		if err := writeFile(ctx, f+".tar", n, write); err != nil {
			return fmt.Errorf("base image %s: %w", n, err)
		}
		if err := os.WriteFile(f+".ref", []byte(n), 0o644); err != nil {
			return err
		}
	}
	root, err := os.Open(tmp)
	if err != nil {
		return err
	}
	defer root.Close()
	pr, pw := io.Pipe()
	go func() {
		_, err := fsarchive.Write(ctx, root, pw, fsarchive.IDMap{})
		pw.CloseWithError(err)
	}()
	defer func() { _ = pr.Close() }()
	if _, err := extract(ctx, a, dirBase, pr, runtime.ArchiveLimits{}); err != nil {
		return fmt.Errorf("hand in the base images: %w", err)
	}
	return nil
}

func writeFile(ctx context.Context, p, ref string, write func(context.Context, string, io.Writer) error) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := write(ctx, ref, f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// extract streams the archive r into the builder's empty directory dir.
func extract(ctx context.Context, a Agent, dir string, r io.Reader, limits runtime.ArchiveLimits) (*agentv1.ArchiveStats, error) {
	stream := a.ExtractPath(ctx)
	first := &agentv1.ExtractPathRequest{Path: dir, MaxBytes: limits.MaxBytes, MaxFiles: limits.MaxFiles}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := r.Read(buf)
		if n > 0 || first != nil {
			m := first
			if m == nil {
				m = &agentv1.ExtractPathRequest{}
			}
			first = nil
			m.Data = append([]byte(nil), buf[:n]...)
			if err := stream.Send(m); err != nil {
				break // CloseAndReceive says why
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		} else if rerr != nil {
			_, _ = stream.CloseAndReceive()
			return nil, rerr
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetStats(), nil
}

// execBuild runs argv in the builder, reporting its output line by line.
func execBuild(ctx context.Context, a Agent, argv []string, emit func(Event)) (*Result, error) {
	stream := a.StreamExec(ctx)
	defer func() { _ = stream.CloseResponse() }()
	// io.EOF from Send: the agent ended the stream (the build may already have exited);
	// Receive returns what it sent and why.
	if err := stream.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: &agentv1.StreamExecInit{Command: argv}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("start the build: %w", err)
	}
	if err := stream.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Close{Close: &agentv1.CloseStdin{}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("start the build: %w", err)
	}
	var steps Steps
	outs := map[agentv1.Stream]*lines{}
	line := func(s Stream, l string) {
		if st, began := steps.Line(l); began {
			emit(Event{Step: &st, InStep: st.Number})
		}
		emit(Event{Stream: s, InStep: steps.Current(), Line: l})
	}
	for {
		msg, err := stream.Receive()
		if err != nil {
			return nil, fmt.Errorf("the build's output: %w", err)
		}
		switch m := msg.Message.(type) {
		case *agentv1.StreamExecResponse_Output:
			s, ls := Stdout, outs[m.Output.Stream]
			if m.Output.Stream == agentv1.Stream_STREAM_STDERR {
				s = Stderr
			}
			if ls == nil {
				ls = &lines{emit: func(l string) { line(s, l) }}
				outs[m.Output.Stream] = ls
			}
			ls.write(m.Output.Data)
		case *agentv1.StreamExecResponse_Exit:
			for _, ls := range outs {
				ls.flush()
			}
			res := &Result{ExitCode: m.Exit.ExitCode, Steps: steps.All()}
			if st, why, ok := steps.Failed(); ok && res.ExitCode != 0 {
				res.Failed, res.Why = &st, why
			}
			return res, nil
		case *agentv1.StreamExecResponse_Error:
			return nil, fmt.Errorf("the build: %s: %s", m.Error.Code, Clip(m.Error.Message, 512))
		}
	}
}

// lines splits a stream into lines of at most MaxLine bytes (the rest of a longer
// line is dropped).
type lines struct {
	buf  []byte
	long bool // the current line was cut; drop until its newline
	emit func(string)
}

func (l *lines) write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if !l.long {
			room := MaxLine - len(l.buf)
			if len(chunk) > room {
				l.buf = append(l.buf, chunk[:room]...)
				l.long = true
			} else {
				l.buf = append(l.buf, chunk...)
			}
		}
		if i < 0 {
			if l.long && len(l.buf) > 0 {
				l.emit(Clip(string(l.buf), MaxLine)) // emit the cut line now, drop its rest
				l.buf = l.buf[:0]
			}
			return
		}
		if !l.long || len(l.buf) > 0 {
			l.emit(Clip(string(l.buf), MaxLine))
		}
		l.buf, l.long, p = l.buf[:0], false, p[i+1:]
	}
}

func (l *lines) flush() {
	if len(l.buf) > 0 {
		l.emit(Clip(string(l.buf), MaxLine))
		l.buf = l.buf[:0]
	}
}

// readLayout reads the builder's OCI layout into dir (created empty) and returns its one
// image.
func readLayout(ctx context.Context, a Agent, dir string, limits runtime.ArchiveLimits) (v1.Image, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	root, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := a.ArchivePath(ctx, connect.NewRequest(&agentv1.ArchivePathRequest{Path: dirOut}))
	if err != nil {
		return nil, fmt.Errorf("read the built image: %w", err)
	}
	defer func() { _ = stream.Close() }()
	pr, pw := io.Pipe()
	go func() {
		for stream.Receive() {
			if d := stream.Msg().GetData(); len(d) > 0 {
				if _, err := pw.Write(d); err != nil {
					return
				}
			}
		}
		err := stream.Err()
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	_, err = fsarchive.Extract(ctx, pr, root, limits, fsarchive.IDMap{})
	pr.CloseWithError(errors.New("done"))
	if err != nil {
		return nil, fmt.Errorf("read the built image: %w", err)
	}
	return LayoutImage(dir)
}

// LayoutImage returns the one image of the OCI layout at dir (written by the builder:
// exactly one manifest, an image).
func LayoutImage(dir string) (v1.Image, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("the built image's layout: %w", err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("the built image's layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("the built image's layout: %w", err)
	}
	if len(im.Manifests) != 1 || !im.Manifests[0].MediaType.IsImage() {
		return nil, fmt.Errorf("the built image's layout has %d manifests, want one image", len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("the built image: %w", err)
	}
	return img, nil
}

// Push writes img to ref (a tag: the platform registry's `<host>/<org>/<name>:<tag>`)
// with basic auth (the push token), and returns the digest it is stored under. The
// registry checks each blob's digest as it receives it.
func Push(ctx context.Context, img v1.Image, ref string, username, password string, insecure bool) (string, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.NewTag(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("push to %q: %w", ref, err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuth(&authn.Basic{Username: username, Password: password})); err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}
