package main

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/store"
)

type oneKey struct{}

func (oneKey) Authenticate(k string) (auth.Principal, error) {
	if k == "sbx_admin" {
		return auth.Principal{KeyID: "k", Org: "org-a", Role: auth.RoleAdmin}, nil
	}
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestRegistryGCCommand: `sandboxd registry gc` deletes an old image nothing names and
// keeps one a template names; it refuses a store that does not exist.
func TestRegistryGCCommand(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, storeFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Orgs().Create(ctx, store.Org{ID: "org-a", Name: "org-a"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(nil)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	reg, err := registry.New(ctx, registry.Config{Dir: filepath.Join(dir, "registry"), Auth: oneKey{}, TokenKey: bytes.Repeat([]byte("k"), 32), Host: host})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	srv.Config.Handler = reg
	admin := remote.WithAuth(&authn.Basic{Username: "x", Password: "sbx_admin"})
	refs := map[string]string{}
	for _, repo := range []string{"kept", "gone"} {
		img, _ := random.Image(128, 1)
		r, _ := name.ParseReference(host+"/org-a/"+repo+":v1", name.Insecure)
		if err := remote.Write(r, img, admin); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		refs[repo] = host + "/org-a/" + repo + "@" + d.String()
	}
	// The template names the kept image by tag, in a Compose attachment.
	if _, err := st.Templates().Create(ctx, store.Template{ID: "t1", Org: "org-a", DisplayName: "t1", Spec: []byte{},
		Attachments: []byte(`{"compose":"services:\n  a:\n    image: ` + host + `/org-a/kept:v1\n"}`)}, 0); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	old := time.Now().Add(-2 * time.Hour)
	_ = filepath.Walk(filepath.Join(dir, "registry"), func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			err = os.Chtimes(p, old, old)
		}
		return err
	})

	var out bytes.Buffer
	if err := registryCmd([]string{"gc", "--data-dir", dir, "--registry-gc-grace", "1m"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "deleted 1 manifests") {
		t.Errorf("output %q", out.String())
	}
	for repo, ref := range refs {
		r, _ := name.ParseReference(ref, name.Insecure)
		_, err := remote.Image(r, admin)
		var te *transport.Error
		if gone := errors.As(err, &te) && te.StatusCode == http.StatusNotFound; gone != (repo == "gone") {
			t.Errorf("%s after gc: %v", repo, err)
		}
	}
	if err := registryCmd([]string{"gc", "--data-dir", dir, "--store", filepath.Join(dir, "nope.db")}, &out); err == nil {
		t.Error("a missing store was accepted (it would be created empty and name nothing)")
	}
}
