package gateway

import (
	"context"
	"encoding/json"
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
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/store"
)

type fixedKey struct{}

func (fixedKey) Authenticate(key string) (auth.Principal, error) {
	if key == "sbx_admin" {
		return auth.Principal{KeyID: "k1", Org: testOrg, Role: auth.RoleAdmin}, nil
	}
	return auth.Principal{}, auth.ErrInvalidKey
}

// TestRegistryGCPass: images named by a live template (spec or attachments) or a live
// sandbox stay; those of a deleted template, an ended sandbox or nothing are collected.
func TestRegistryGCPass(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: testOrg, Name: testOrg}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(nil)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	regDir := filepath.Join(dir, "registry")
	reg, err := registry.New(ctx, registry.Config{Dir: regDir, Auth: fixedKey{}, TokenKey: []byte(strings.Repeat("k", 32)), Host: host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	srv.Config.Handler = reg
	admin := remote.WithAuth(&authn.Basic{Username: "x", Password: "sbx_admin"})
	digests := map[string]string{}
	for _, repo := range []string{"tmpl", "attached", "live", "deleted", "ended", "none"} {
		img, err := random.Image(256, 1)
		if err != nil {
			t.Fatal(err)
		}
		ref, _ := name.ParseReference(host+"/"+testOrg+"/"+repo+":v1", name.Insecure)
		if err := remote.Write(ref, img, admin); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		digests[repo] = host + "/" + testOrg + "/" + repo + "@" + d.String()
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := filepath.Walk(regDir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, old, old)
	}); err != nil {
		t.Fatal(err)
	}

	template := func(id, image, attachments string) {
		spec, _ := proto.Marshal(&sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Image: image}}})
		var att []byte
		if attachments != "" {
			att, _ = json.Marshal(map[string]string{"compose.yaml": attachments})
		}
		if _, err := st.Templates().Create(ctx, store.Template{ID: id, Org: testOrg, DisplayName: id, Spec: spec, Attachments: att}, 0); err != nil {
			t.Fatal(err)
		}
	}
	template("t1", digests["tmpl"], "services:\n  db:\n    image: "+host+"/"+testOrg+"/attached:v1\n")
	template("t2", digests["deleted"], "")
	if _, err := st.Templates().Delete(ctx, testOrg, "t2"); err != nil {
		t.Fatal(err)
	}
	sandbox := func(id, image string, ended bool) {
		spec, _ := json.Marshal(map[string]any{"container": map[string]string{"image": image}})
		if _, err := st.Sandboxes().Create(ctx, store.Sandbox{ID: id, Org: testOrg, RunnerID: "r1", State: "RUNNING", Spec: spec}); err != nil {
			t.Fatal(err)
		}
		if ended {
			now := time.Now()
			if _, err := st.Sandboxes().UpdateStatus(ctx, testOrg, id, store.SandboxStatusUpdate{State: "COMPLETED", EndedAt: &now}); err != nil {
				t.Fatal(err)
			}
		}
	}
	sandbox("s1", digests["live"], false)
	sandbox("s2", digests["ended"], true)

	g := NewRegistryGC(reg, st, RegistryGCConfig{Grace: time.Minute}, quietLog())
	res, err := g.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifests != 3 || res.Blobs == 0 {
		t.Errorf("pass: %+v, want 3 manifests and their blobs", res)
	}
	for repo, ref := range digests {
		r, _ := name.ParseReference(ref, name.Insecure)
		_, err := remote.Image(r, admin)
		var te *transport.Error
		switch repo {
		case "tmpl", "attached", "live":
			if err != nil {
				t.Errorf("%s: %v, want kept", repo, err)
			}
		default:
			if !errors.As(err, &te) || te.StatusCode != http.StatusNotFound {
				t.Errorf("%s: %v, want collected (404)", repo, err)
			}
		}
	}
}

// TestRegistryGCStoreErrorDeletesNothing: a pass that cannot read the references
// collects nothing.
func TestRegistryGCStoreErrorDeletesNothing(t *testing.T) {
	called := false
	g := NewRegistryGC(collectorFunc(func(context.Context, registry.GCOptions) (registry.GCResult, error) {
		called = true
		return registry.GCResult{}, nil
	}), brokenStore{}, RegistryGCConfig{}, quietLog())
	if _, err := g.Pass(t.Context()); err == nil || called {
		t.Fatalf("pass with an unreadable store: err %v, collector called %v", err, called)
	}
}

type collectorFunc func(context.Context, registry.GCOptions) (registry.GCResult, error)

func (f collectorFunc) GC(ctx context.Context, o registry.GCOptions) (registry.GCResult, error) {
	return f(ctx, o)
}

type brokenStore struct{ store.Store }

func (brokenStore) Orgs() store.Orgs { return brokenOrgs{} }

type brokenOrgs struct{ store.Orgs }

func (brokenOrgs) List(context.Context) ([]store.Org, error) { return nil, errors.New("db down") }
