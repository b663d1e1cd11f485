package kubernetes

import (
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
