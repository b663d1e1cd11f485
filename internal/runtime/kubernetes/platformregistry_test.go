package kubernetes

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPlatformImageConfig: the image config of an image of the platform registry (here
// on loopback, plain HTTP, asking for credentials) is read with the sandbox's pull
// token; the same registry under another name, or without being named the platform's,
// is refused by the guard.
func TestPlatformImageConfig(t *testing.T) {
	mem := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "sandboxd" || p != "sbxreg.tok" {
			w.Header().Set("WWW-Authenticate", `Basic realm="sandboxd registry"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mem.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf.Config.Cmd = []string{"/bin/app", "--serve"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	ref := host + "/org-a/tmpl@" + d.String()
	pushRef, _ := name.ParseReference(ref, name.Insecure)
	if err := remote.Write(pushRef, img, remote.WithAuth(&authn.Basic{Username: "sandboxd", Password: "sbxreg.tok"})); err != nil {
		t.Fatal(err)
	}
	creds := &runtime.Credentials{Username: "sandboxd", Password: "sbxreg.tok"}

	ic, err := PlatformImageConfig(host, true)(t.Context(), ref, creds)
	if err != nil {
		t.Fatalf("platform registry: %v", err)
	}
	if strings.Join(ic.Cmd, " ") != "/bin/app --serve" {
		t.Errorf("cmd %q", ic.Cmd)
	}
	if _, err := PlatformImageConfig(host, true)(t.Context(), ref, &runtime.Credentials{Username: "sandboxd", Password: "wrong"}); !errors.Is(err, runtime.ErrImageUnauthorized) {
		t.Errorf("wrong token: %v, want ErrImageUnauthorized", err)
	}
	other := strings.Replace(ref, "127.0.0.1", "localhost", 1)
	for _, c := range []struct {
		what string
		read func() error
	}{
		{"not named", func() error { _, err := RegistryImageConfig(t.Context(), ref, creds); return err }},
		{"another name", func() error { _, err := PlatformImageConfig(host, true)(t.Context(), other, creds); return err }},
	} {
		if err := c.read(); !errors.Is(err, runtime.ErrInvalidImageRef) {
			t.Errorf("%s: %v, want the guard's refusal", c.what, err)
		}
	}

	// The pull Secret the kubelet pulls it with: the token, for the registry's host, and
	// the Pod names it.
	spec := &runtime.Spec{ID: "s1", Container: runtime.Container{Image: ref, PullCredentials: creds}}
	sec, err := dockerConfigSecret(spec)
	if err != nil || sec == nil {
		t.Fatal(sec, err)
	}
	var dc struct {
		Auths map[string]struct{ Username, Password string }
	}
	mustJSON(t, sec.Data[corev1.DockerConfigJsonKey], &dc)
	if a := dc.Auths[host]; len(dc.Auths) != 1 || a.Username != "sandboxd" || a.Password != "sbxreg.tok" {
		t.Errorf("auths %+v", dc.Auths)
	}
	if sec.Type != corev1.SecretTypeDockerConfigJson || sec.Name != pullSecretName("s1") {
		t.Errorf("secret %s of type %s", sec.Name, sec.Type)
	}
}

// TestPullPolicyPrivateImages: a container whose image comes with pull credentials (every
// image of the platform registry) is pulled Always, whatever the configured policy, so the
// kubelet asks the registry with this Pod's Secret before running an image its node holds
// from another organization's sandbox; so is one without credentials of its own in a
// registry the Pod's Secret has credentials for. Other images keep the configured policy;
// the agent image too. In a single-container Pod and in a group.
func TestPullPolicyPrivateImages(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", ImagePullPolicy: corev1.PullIfNotPresent, TerminationGrace: 10e9,
		ImageConfig: func(context.Context, string, *runtime.Credentials) (image.Config, error) { return image.Config{}, nil }}}
	creds := &runtime.Credentials{Username: "sandboxd", Password: "sbxreg.tok"}
	const private = "reg.example:5000/org-a/app@sha256:0123456789012345678901234567890123456789012345678901234567890123"

	single := func(c runtime.Container) *corev1.Pod {
		c.Command = "true"
		spec := &runtime.Spec{ID: "s1", Container: c}
		return b.podFor(spec, "", b.labels(spec), []string{pullSecretName(spec.ID)}, nil)
	}
	for _, c := range []struct {
		ctr       runtime.Container
		main, gte corev1.PullPolicy
	}{
		{runtime.Container{Image: private, PullCredentials: creds}, corev1.PullAlways, corev1.PullIfNotPresent},
		{runtime.Container{Image: private}, corev1.PullIfNotPresent, corev1.PullIfNotPresent},
		{runtime.Container{Image: "busybox"}, corev1.PullIfNotPresent, corev1.PullIfNotPresent},
	} {
		pod := single(c.ctr)
		if got := pod.Spec.Containers[1].ImagePullPolicy; got != c.main {
			t.Errorf("%s (credentials %v): main %s, want %s", c.ctr.Image, c.ctr.PullCredentials != nil, got, c.main)
		}
		if got := pod.Spec.Containers[0].ImagePullPolicy; got != c.gte {
			t.Errorf("%s: gate %s, want %s", c.ctr.Image, got, c.gte)
		}
	}

	spec := &runtime.Spec{ID: "g1",
		Container: runtime.Container{Name: "app", Image: private, Command: "true", PullCredentials: creds},
		Sidecars: []runtime.Container{
			{Name: "same", Image: "reg.example:5000/org-a/db:1", Command: "true"},
			{Name: "pub", Image: "busybox", Command: "true"},
		},
		InitContainers: []runtime.Container{{Name: "mig", Image: "reg.example:5000/org-a/mig:1", Command: "true", PullCredentials: creds}},
	}
	if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
		t.Fatal(err)
	}
	g, err := b.prepareGroup(context.Background(), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := b.podForGroup(spec, g, "", b.labels(spec), []string{pullSecretName(spec.ID)})
	want := map[string]corev1.PullPolicy{"sandbox": corev1.PullAlways, "same": corev1.PullAlways, "pub": corev1.PullIfNotPresent,
		"mig": corev1.PullAlways, containerGate: corev1.PullIfNotPresent, containerInstall: corev1.PullIfNotPresent}
	seen := 0
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for n, p := range want {
			if c.Name == n || strings.HasSuffix(c.Name, "-"+n) {
				seen++
				if c.ImagePullPolicy != p {
					t.Errorf("group container %s (%s): %s, want %s", c.Name, c.Image, c.ImagePullPolicy, p)
				}
			}
		}
	}
	if seen < len(want) {
		t.Errorf("matched %d of %d containers in %v", seen, len(want), pod.Spec.Containers)
	}
}
