// Package testimage turns the rootfs tarballs built by scripts/build-test-images.sh
// into OCI images and serves them from an in-process OCI distribution registry on
// loopback, for tests and `sandboxd dev` demos.
package testimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sandboxd/sandboxd/internal/image"
)

// Script builds the tarballs this package needs.
const Script = "scripts/build-test-images.sh"

// ErrNoTestImages means the cached rootfs tarballs are missing.
var ErrNoTestImages = errors.New("test image tarballs missing: run " + Script + " (as root)")

// Standard references pushed by Standard.
const (
	Busybox      = "sandboxd/busybox:latest"
	BusyboxMulti = "sandboxd/busybox:multi"
	Python       = "sandboxd/python:3.11"
	// Redis is Debian's redis-server and redis-tools (redis.tar): optional, see RedisImage.
	Redis = "sandboxd/redis:7"
	// Clients is Debian's curl and Node.js (clients.tar): optional, see ClientsImage.
	Clients = "sandboxd/clients:test"
	// BusyboxWorkDir is Busybox with WorkDir as its config's working dir; only the test
	// cluster has it (test/k8s/imagetool).
	BusyboxWorkDir = "sandboxd/busybox:workdir"
	WorkDir        = "/root"
	// BusyboxDeepWorkDir is Busybox with DeepWorkDir as its config's working dir, a path
	// below VolumeParent where a test mounts a volume (an image-only working directory
	// inside a volume); only the test cluster has it (test/k8s/imagetool).
	BusyboxDeepWorkDir = "sandboxd/busybox:deepworkdir"
	VolumeParent       = "/srv/vol"
	DeepWorkDir        = VolumeParent + "/app/work"
)

// DefaultPath is the PATH set in the standard images.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Dir is where the tarballs live: ${SANDBOXD_CACHE:-/var/cache/sandboxd}/images.
func Dir() string {
	c := os.Getenv("SANDBOXD_CACHE")
	if c == "" {
		c = "/var/cache/sandboxd"
	}
	return filepath.Join(c, "images")
}

const sourceKeyFile = "sandboxd-source"

// Build makes a one-layer (gzip) image from a rootfs tarball plus cfg. The compressed
// layer is cached as an OCI layout <tarball without .tar>.oci/ next to the tarball,
// keyed by the tarball's size and mtime, so later calls do not recompress.
func Build(rootfsTar string, cfg image.Config) (v1.Image, error) {
	fi, err := os.Stat(rootfsTar)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("%d %d", fi.Size(), fi.ModTime().UnixNano())
	ociDir := strings.TrimSuffix(rootfsTar, ".tar") + ".oci"
	layer, err := cachedLayer(ociDir, key)
	if err != nil {
		if layer, err = buildLayer(rootfsTar, ociDir, key); err != nil {
			return nil, err
		}
	}
	return withConfig(layer, cfg, "amd64")
}

func withConfig(layer v1.Layer, cfg image.Config, arch string) (v1.Image, error) {
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Config: v1.Config{
			Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: cfg.Env,
			WorkingDir: cfg.WorkingDir, User: cfg.User,
		},
	})
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return mutate.AppendLayers(img, layer)
}

func cachedLayer(ociDir, key string) (v1.Layer, error) {
	b, err := os.ReadFile(filepath.Join(ociDir, sourceKeyFile))
	if err != nil || strings.TrimSpace(string(b)) != key {
		return nil, errors.New("stale")
	}
	p, err := layout.FromPath(ociDir)
	if err != nil {
		return nil, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) == 0 {
		return nil, errors.New("empty layout")
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		return nil, err
	}
	ls, err := img.Layers()
	if err != nil || len(ls) != 1 {
		return nil, errors.New("unexpected layout image")
	}
	return ls[0], nil
}

func buildLayer(rootfsTar, ociDir, key string) (v1.Layer, error) {
	tmpDir, err := os.MkdirTemp(filepath.Dir(ociDir), ".oci-build-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmpDir)
	gzPath := filepath.Join(tmpDir, "layer.tar.gz")
	if err := gzipFile(rootfsTar, gzPath); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(gzPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := withConfig(layer, image.Config{}, "amd64")
	if err != nil {
		return nil, err
	}
	out := filepath.Join(tmpDir, "layout")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return nil, err
	}
	if err := p.AppendImage(img); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, sourceKeyFile), []byte(key+"\n"), 0o644); err != nil {
		return nil, err
	}
	_ = os.RemoveAll(ociDir)
	if err := os.Rename(out, ociDir); err != nil {
		return nil, err
	}
	return cachedLayer(ociDir, key)
}

func gzipFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		out.Close()
		return err
	}
	if _, err := io.Copy(zw, in); err != nil {
		out.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// RegistryOptions configure StartRegistryWith.
type RegistryOptions struct {
	// Listen is the address to serve on (default 127.0.0.1:0).
	Listen string
	// BasicAuth, if set, requires HTTP basic auth with these credentials on every /v2/ request.
	BasicAuth *image.Credentials
	// BearerAuth, if set, requires a bearer token obtained from the registry's own
	// /token endpoint with these basic credentials (the Docker token flow).
	BearerAuth *image.Credentials
	// OnRequest, if set, sees every request (before auth), e.g. to count blob fetches.
	OnRequest func(*http.Request)
}

// StartRegistry serves an empty OCI distribution registry on 127.0.0.1:<random>.
func StartRegistry(ctx context.Context) (host string, stop func(), err error) {
	return StartRegistryWith(ctx, RegistryOptions{})
}

// StartRegistryWith is StartRegistry with options (address, auth, request hook).
func StartRegistryWith(ctx context.Context, o RegistryOptions) (host string, stop func(), err error) {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", o.Listen)
	if err != nil {
		return "", nil, err
	}
	host = ln.Addr().String()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var h http.Handler = reg
	switch {
	case o.BearerAuth != nil:
		h = bearerAuth(host, *o.BearerAuth, reg)
	case o.BasicAuth != nil:
		h = basicAuth(*o.BasicAuth, reg)
	}
	if o.OnRequest != nil {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			o.OnRequest(r)
			inner.ServeHTTP(w, r)
		})
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			_ = srv.Close()
		})
	}
	return host, stop, nil
}

func basicAuth(c image.Credentials, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != c.Username || p != c.Password {
			w.Header().Set("WWW-Authenticate", `Basic realm="sandboxd-test"`)
			writeRegErr(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func bearerAuth(host string, c image.Credentials, next http.Handler) http.Handler {
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			u, p, ok := r.BasicAuth()
			if !ok || u != c.Username || p != c.Password {
				writeRegErr(w, http.StatusUnauthorized, "UNAUTHORIZED", "bad credentials")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"token":%q,"access_token":%q,"expires_in":300}`, token, token)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s/token",service="sandboxd-test"`, host))
			writeRegErr(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeRegErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q}]}`, code, msg)
}

func ref(host, repoTag string) (name.Reference, error) {
	return name.ParseReference(host+"/"+repoTag, name.Insecure)
}

// Push uploads img as host/repoTag (plain HTTP) and returns its manifest digest.
func Push(host, repoTag string, img v1.Image) (digest string, err error) {
	return PushAuth(host, repoTag, img, nil)
}

// PushAuth is Push with credentials for an auth-protected test registry.
func PushAuth(host, repoTag string, img v1.Image, c *image.Credentials) (string, error) {
	r, err := ref(host, repoTag)
	if err != nil {
		return "", err
	}
	if err := remote.Write(r, img, remoteOpts(c)...); err != nil {
		return "", fmt.Errorf("push %s: %w", r, err)
	}
	d, err := img.Digest()
	return d.String(), err
}

// PushIndex uploads a multi-platform index (and its images) as host/repoTag.
func PushIndex(host, repoTag string, idx v1.ImageIndex) (string, error) {
	r, err := ref(host, repoTag)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		return "", fmt.Errorf("push %s: %w", r, err)
	}
	d, err := idx.Digest()
	return d.String(), err
}

func remoteOpts(c *image.Credentials) []remote.Option {
	if c == nil {
		return nil
	}
	return []remote.Option{remote.WithAuth(&authn.Basic{Username: c.Username, Password: c.Password})}
}

// LayerFromTar makes a gzip layer from an uncompressed tar stream in memory.
func LayerFromTar(tarBytes []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// LayerFromFiles makes a layer holding regular files (mode 0644, root-owned).
func LayerFromFiles(files map[string][]byte) (v1.Layer, error) {
	return layerOfFiles(files, 0o644)
}

// ExecutableLayer makes a layer holding executables (mode 0755, root-owned).
func ExecutableLayer(files map[string][]byte) (v1.Layer, error) {
	return layerOfFiles(files, 0o755)
}

func layerOfFiles(files map[string][]byte, mode int64) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: mode, Size: int64(len(files[n])), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return LayerFromTar(buf.Bytes())
}

// ImageFromLayers makes a linux/amd64 image of the given layers (bottom first) and cfg.
func ImageFromLayers(cfg image.Config, layers ...v1.Layer) (v1.Image, error) {
	if len(layers) == 0 {
		return nil, errors.New("no layers")
	}
	img, err := withConfig(layers[0], cfg, "amd64")
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(img, layers[1:]...)
}

// MultiArch builds an index with a fake linux/arm64 image first and amd64 second,
// so a client that takes the first entry gets the wrong one.
func MultiArch(amd64 v1.Image) (v1.ImageIndex, error) {
	junk := make([]byte, 64)
	_, _ = rand.Read(junk)
	fake, err := randomLayer(junk)
	if err != nil {
		return nil, err
	}
	arm, err := withConfig(fake, image.Config{Cmd: []string{"/bin/false"}}, "arm64")
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	return mutate.AppendManifests(idx,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
		mutate.IndexAddendum{Add: amd64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	), nil
}

func randomLayer(content []byte) (v1.Layer, error) {
	h := sha256.Sum256(content)
	return LayerFromFiles(map[string][]byte{"junk-" + hex.EncodeToString(h[:4]): content})
}

// Images holds the standard test images, built once per process.
type Images struct {
	Busybox, Python v1.Image
}

var (
	stdOnce sync.Once
	stdImgs *Images
	stdErr  error
)

// StandardImages builds (or loads from cache) the busybox and python images.
func StandardImages() (*Images, error) {
	stdOnce.Do(func() {
		dir := Dir()
		bb, py := filepath.Join(dir, "busybox.tar"), filepath.Join(dir, "python.tar")
		for _, p := range []string{bb, py} {
			if _, err := os.Stat(p); err != nil {
				stdErr = fmt.Errorf("%w (%s)", ErrNoTestImages, p)
				return
			}
		}
		var imgs Images
		if imgs.Busybox, stdErr = Build(bb, image.Config{Cmd: []string{"/bin/sh"}, Env: []string{DefaultPath}}); stdErr != nil {
			return
		}
		if imgs.Python, stdErr = Build(py, image.Config{Cmd: []string{"python3"}, Env: []string{DefaultPath, "LANG=C.UTF-8"}}); stdErr != nil {
			return
		}
		stdImgs = &imgs
	})
	return stdImgs, stdErr
}

var (
	redisOnce sync.Once
	redisImg  v1.Image
	redisErr  error
)

// RedisImage builds (or loads from cache) the redis image: redis-server as its command,
// redis-cli beside it. It is not a standard image (only the Compose tests need it), so
// a missing redis.tar is ErrNoTestImages for its callers alone.
func RedisImage() (v1.Image, error) {
	redisOnce.Do(func() {
		p := filepath.Join(Dir(), "redis.tar")
		if _, err := os.Stat(p); err != nil {
			redisErr = fmt.Errorf("%w (%s)", ErrNoTestImages, p)
			return
		}
		redisImg, redisErr = Build(p, image.Config{Cmd: []string{"redis-server"}, Env: []string{DefaultPath, "LANG=C.UTF-8"}})
	})
	return redisImg, redisErr
}

var (
	clientsOnce sync.Once
	clientsImg  v1.Image
	clientsErr  error
)

// ClientsImage builds (or loads from cache) the clients image: Debian's curl and
// Node.js, real HTTPS clients for the egress secret tests, built only when asked
// (`build-test-images.sh clients`): ErrNoTestImages while it is missing, unless
// SANDBOXD_CLIENTS_IMAGE=1 (CI builds it in the background), when it waits up to
// EngineImageWait for the build and then fails.
func ClientsImage() (v1.Image, error) {
	clientsOnce.Do(func() {
		p, err := optionalTar(Dir(), "clients", "SANDBOXD_CLIENTS_IMAGE", os.Getenv("SANDBOXD_CLIENTS_IMAGE") == "1", EngineImageWait)
		if err != nil {
			clientsErr = err
			return
		}
		clientsImg, clientsErr = Build(p, image.Config{Cmd: []string{"/bin/sh"}, Env: []string{DefaultPath, "LANG=C.UTF-8"}})
	})
	return clientsImg, clientsErr
}

// Standard starts a registry with sandboxd/busybox:latest, sandboxd/python:3.11 and
// the multi-arch index sandboxd/busybox:multi pushed, and returns its host.
// With t non-nil it skips the test when the tarballs are missing (naming the
// script), fails it on other errors and stops the registry at cleanup.
func Standard(ctx context.Context, t testing.TB) (host string, stop func(), err error) {
	if t != nil {
		t.Helper()
	}
	host, stop, err = standard(ctx)
	if t != nil {
		if errors.Is(err, ErrNoTestImages) {
			t.Skipf("%v", err)
		}
		if err != nil {
			t.Fatalf("testimage.Standard: %v", err)
		}
		t.Cleanup(stop)
	}
	return host, stop, err
}

func standard(ctx context.Context) (string, func(), error) {
	imgs, err := StandardImages()
	if err != nil {
		return "", nil, err
	}
	host, stop, err := StartRegistry(ctx)
	if err != nil {
		return "", nil, err
	}
	if err := PushStandard(host, imgs); err != nil {
		stop()
		return "", nil, err
	}
	return host, stop, nil
}

// PushStandard pushes the standard images to host.
func PushStandard(host string, imgs *Images) error {
	if _, err := Push(host, Busybox, imgs.Busybox); err != nil {
		return err
	}
	if _, err := Push(host, Python, imgs.Python); err != nil {
		return err
	}
	idx, err := MultiArch(imgs.Busybox)
	if err != nil {
		return err
	}
	_, err = PushIndex(host, BusyboxMulti, idx)
	return err
}

// Engine is the engine test image (engine.tar: Debian's Docker Engine, the compose
// plugin, cws-engine as its command): optional, see EngineImage.
const Engine = "sandboxd/engine:test"

// EngineImageWait bounds how long EngineImage waits for a build under way when
// SANDBOXD_ENGINE_IMAGE=1 (CI builds the image in the background: ~2-6 min cold).
var EngineImageWait = 15 * time.Minute

var (
	engineOnce sync.Once
	engineImg  v1.Image
	engineErr  error
)

// EngineImage builds (or loads from cache) the engine image: cws-engine (dockerd under
// gVisor) as its command, cws-engine-up beside it. It is built only when asked
// (`build-test-images.sh engine`): locally a missing engine.tar is ErrNoTestImages for
// its callers alone (they skip). With SANDBOXD_ENGINE_IMAGE=1 (CI, which builds it in
// the background) EngineImage waits for the build (its .inputs file is written last)
// up to EngineImageWait, and a missing image is an error callers fail on.
func EngineImage() (v1.Image, error) {
	engineOnce.Do(func() { engineImg, engineErr = engineImage(Dir(), EngineImageRequired(), EngineImageWait) })
	return engineImg, engineErr
}

// EngineImageIfBuilt is EngineImage without the wait: ErrNoTestImages unless the build
// has finished, whatever SANDBOXD_ENGINE_IMAGE says (`sandboxd dev` must not hold its
// start-up for a build under way).
func EngineImageIfBuilt() (v1.Image, error) {
	if _, err := engineTar(Dir(), false, 0); err != nil {
		return nil, err
	}
	return EngineImage()
}

func engineImage(dir string, required bool, wait time.Duration) (v1.Image, error) {
	p, err := engineTar(dir, required, wait)
	if err != nil {
		return nil, err
	}
	return Build(p, image.Config{Cmd: []string{"/usr/local/bin/cws-engine"}, Env: []string{DefaultPath, "LANG=C.UTF-8"}})
}

// EngineTar is the engine image's rootfs tarball (engine.tar), with EngineImage's rules
// for a missing one: ErrNoTestImages locally, a wait and then a failure under
// SANDBOXD_ENGINE_IMAGE=1.
func EngineTar() (string, error) { return engineTar(Dir(), EngineImageRequired(), EngineImageWait) }

func engineTar(dir string, required bool, wait time.Duration) (string, error) {
	return optionalTar(dir, "engine", "SANDBOXD_ENGINE_IMAGE", required, wait)
}

// optionalTar is <dir>/<name>.tar of an image built only when asked: ErrNoTestImages
// while its .inputs file (written last by the build) is missing, unless required, when
// it waits up to wait for a build under way and then fails (env names the variable).
func optionalTar(dir, name, env string, required bool, wait time.Duration) (string, error) {
	p := filepath.Join(dir, name+".tar")
	done := filepath.Join(dir, name+".inputs") // written last by the build
	if required {
		deadline := time.Now().Add(wait)
		for {
			if _, err := os.Stat(done); err == nil {
				break
			}
			if !time.Now().Before(deadline) {
				return "", fmt.Errorf("%s test image %s not built within %v (%s=1): see %s", name, p, wait, env, filepath.Join(filepath.Dir(dir), "build-"+name+"-image.log"))
			}
			time.Sleep(min(5*time.Second, wait))
		}
	}
	if _, err := os.Stat(done); err != nil {
		return "", fmt.Errorf("%w (%s: run %s %s)", ErrNoTestImages, p, Script, name)
	}
	return p, nil
}

// BuilderTar is the builder image's rootfs tarball (builder.tar: Debian's Buildah, for
// image builds inside gVisor, docs/builds.md), built only when asked
// (`build-test-images.sh builder`): ErrNoTestImages while it is missing, unless
// SANDBOXD_BUILDER_IMAGE=1 (CI builds it in the background), when it waits up to
// EngineImageWait for the build and then fails.
func BuilderTar() (string, error) {
	return optionalTar(Dir(), "builder", "SANDBOXD_BUILDER_IMAGE", os.Getenv("SANDBOXD_BUILDER_IMAGE") == "1", EngineImageWait)
}

// Builder is the reference `sandboxd dev` serves the builder test image as (under
// docker.io, through its test-image mirror).
const Builder = "sandboxd/builder:test"

// BuilderImageIfBuilt is the builder image (BuilderTar's rootfs, Buildah's environment)
// when its build has finished, else ErrNoTestImages, whatever SANDBOXD_BUILDER_IMAGE says
// (`sandboxd dev` must not hold its start-up for a build under way).
func BuilderImageIfBuilt() (v1.Image, error) {
	p, err := optionalTar(Dir(), "builder", "SANDBOXD_BUILDER_IMAGE", false, 0)
	if err != nil {
		return nil, err
	}
	return builderImage(p)
}

// BuilderImage is the builder image as tests use it: BuilderTar's rootfs (with its
// ErrNoTestImages and its wait under SANDBOXD_BUILDER_IMAGE=1) and Buildah's environment.
func BuilderImage() (v1.Image, error) {
	p, err := BuilderTar()
	if err != nil {
		return nil, err
	}
	return builderImage(p)
}

// PushBuilder pushes BuilderImage to the test registry host as sandboxd/builder:1 and
// returns its reference, what runner.Local.BuilderImage takes.
func PushBuilder(host string) (string, error) {
	img, err := BuilderImage()
	if err != nil {
		return "", err
	}
	if _, err := Push(host, "sandboxd/builder:1", img); err != nil {
		return "", err
	}
	return host + "/sandboxd/builder:1", nil
}

func builderImage(rootfsTar string) (v1.Image, error) {
	return Build(rootfsTar, image.Config{Env: []string{DefaultPath, "LANG=C.UTF-8"}})
}

// EngineImageRequired reports SANDBOXD_ENGINE_IMAGE=1: tests needing the engine image
// fail without it instead of skipping.
func EngineImageRequired() bool { return os.Getenv("SANDBOXD_ENGINE_IMAGE") == "1" }
