// Command image builds the two images a Kubernetes runner needs, without a container
// engine (go-containerregistry), from static binaries (scripts/build-runner-image.sh
// builds them and runs this):
//
//   - the runner image: /sandboxd (entrypoint; the chart passes `runner …` as args), the
//     CA bundle for registries and the control plane, an empty /tmp; user 65532;
//   - the agent image: /sandbox-agent and /sandbox-gate, which the Kubernetes backend
//     injects into every sandbox Pod.
//
// Each image is written as a docker-archive tarball (-out, for `ctr images import`,
// `docker load`, `podman load`) and/or pushed to a registry (-push, with the credentials
// of ~/.docker/config.json). Layers are built with fixed timestamps, so the same binaries
// give the same digests.
//
// Usage: go run ./deploy/image -sandboxd BIN -agent BIN -gate BIN -runner-ref REF -agent-ref REF [-tag T]... [-out DIR] [-push]
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The runner does not need root: the chart runs it as this user (fsGroup for its volume).
const nonRoot = "65532:65532"

// arch is the images' architecture (-arch).
var arch string

// epoch is every file's modification time and the images' creation time (reproducible).
var epoch = time.Unix(1700000000, 0).UTC()

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o options
	flag.StringVar(&o.sandboxd, "sandboxd", "", "static sandboxd binary (CGO_ENABLED=0)")
	flag.StringVar(&o.agent, "agent", "", "static sandbox-agent binary")
	flag.StringVar(&o.gate, "gate", "", "static sandbox-gate binary")
	flag.StringVar(&o.caBundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to put at /etc/ssl/certs/ca-certificates.crt in the runner image")
	flag.StringVar(&o.runnerRef, "runner-ref", "", "runner image reference, e.g. ghcr.io/me/sandboxd-runner:v1 (empty: no runner image)")
	flag.StringVar(&o.agentRef, "agent-ref", "", "agent image reference (empty: no agent image)")
	flag.Var(&o.tags, "tag", "another tag for both images (repeatable)")
	flag.StringVar(&o.out, "out", "", "write runner.tar and agent.tar (docker-archive) here")
	flag.BoolVar(&o.push, "push", false, "push the images to their registries")
	flag.StringVar(&arch, "arch", runtime.GOARCH, "the binaries' GOARCH, recorded in the images")
	flag.Parse()
	if err := o.run(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

type options struct {
	sandboxd, agent, gate, caBundle string
	runnerRef, agentRef, out        string
	tags                            listFlag
	push                            bool
}

func (o *options) run() error {
	if o.out == "" && !o.push {
		return errors.New("nothing to do: give -out DIR and/or -push")
	}
	type built struct {
		file string
		refs []name.Tag
		img  v1.Image
	}
	var imgs []built
	if o.runnerRef != "" {
		img, err := runnerImage(o.sandboxd, o.caBundle)
		if err != nil {
			return fmt.Errorf("runner image: %w", err)
		}
		refs, err := o.refs(o.runnerRef)
		if err != nil {
			return err
		}
		imgs = append(imgs, built{"runner.tar", refs, img})
	}
	if o.agentRef != "" {
		img, err := agentImage(o.agent, o.gate)
		if err != nil {
			return fmt.Errorf("agent image: %w", err)
		}
		refs, err := o.refs(o.agentRef)
		if err != nil {
			return err
		}
		imgs = append(imgs, built{"agent.tar", refs, img})
	}
	if len(imgs) == 0 {
		return errors.New("nothing to build: give -runner-ref and/or -agent-ref")
	}
	for _, b := range imgs {
		if o.out != "" {
			if err := os.MkdirAll(o.out, 0o755); err != nil {
				return err
			}
			m := map[name.Tag]v1.Image{}
			for _, r := range b.refs {
				m[r] = b.img
			}
			if err := tarball.MultiRefWriteToFile(filepath.Join(o.out, b.file), toRefs(m)); err != nil {
				return fmt.Errorf("write %s: %w", b.file, err)
			}
		}
		if o.push {
			for _, r := range b.refs {
				if err := remote.Write(r, b.img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
					return fmt.Errorf("push %s: %w", r, err)
				}
				d, _ := b.img.Digest()
				fmt.Printf("pushed %s@%s\n", r, d)
			}
		}
	}
	return nil
}

func toRefs(m map[name.Tag]v1.Image) map[name.Reference]v1.Image {
	out := make(map[name.Reference]v1.Image, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// refs is ref and ref with each extra tag.
func (o *options) refs(ref string) ([]name.Tag, error) {
	t, err := name.NewTag(ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	out := []name.Tag{t}
	for _, tag := range o.tags {
		if out[0].TagStr() == tag {
			continue
		}
		nt, err := name.NewTag(t.Repository.Name() + ":" + tag)
		if err != nil {
			return nil, fmt.Errorf("-tag %s: %w", tag, err)
		}
		out = append(out, nt)
	}
	return out, nil
}

type entry struct {
	path string
	mode int64
	data []byte // nil: a directory
}

func runnerImage(sandboxd, caBundle string) (v1.Image, error) {
	bin, err := os.ReadFile(sandboxd)
	if err != nil {
		return nil, fmt.Errorf("-sandboxd: %w", err)
	}
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return nil, fmt.Errorf("-ca-bundle: %w", err)
	}
	return image([]entry{
		{"etc", 0o755, nil}, {"etc/ssl", 0o755, nil}, {"etc/ssl/certs", 0o755, nil},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, ca},
		{"sandboxd", 0o755, bin},
		{"tmp", 0o1777, nil},
		// The data dir's mount point, for runs without a volume (docker run).
		{"var", 0o755, nil}, {"var/lib", 0o755, nil}, {"var/lib/sandboxd", 0o700, nil},
	}, v1.Config{Entrypoint: []string{"/sandboxd"}, Cmd: []string{"runner", "--help"}, User: nonRoot,
		Env: []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}, WorkingDir: "/"})
}

func agentImage(agent, gate string) (v1.Image, error) {
	var es []entry
	for dst, src := range map[string]string{"sandbox-agent": agent, "sandbox-gate": gate} {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("-%s: %w", strings.TrimPrefix(dst, "sandbox-"), err)
		}
		es = append(es, entry{dst, 0o755, b})
	}
	if es[0].path > es[1].path {
		es[0], es[1] = es[1], es[0]
	}
	return image(es, v1.Config{Entrypoint: []string{"/sandbox-gate"}})
}

// image is a linux image for -arch of one layer holding entries (in order; uid/gid 0 except
// /var/lib/sandboxd, owned by the runner's user).
func image(entries []entry, cfg v1.Config) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.path, Mode: e.mode, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(e.data)), Format: tar.FormatPAX}
		if e.data == nil {
			h.Typeflag, h.Name = tar.TypeDir, e.path+"/"
		}
		if e.path == "var/lib/sandboxd" {
			h.Uid, h.Gid = 65532, 65532
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created, cf.Config = arch, "linux", v1.Time{Time: epoch}, cfg
	return mutate.ConfigFile(img, cf)
}
