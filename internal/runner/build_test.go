package runner

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

type noArchives struct{}

func (noArchives) WriteArchive(context.Context, string, *runtime.Credentials, io.Writer, int64) error {
	return io.ErrUnexpectedEOF
}

// TestBuildRefusedWithTheReason: a runner without a builder image, without the gvisor
// class or without a way to hand in base images refuses builds with
// CWSANDBOX_BUILD_NOT_SUPPORTED naming why, before it creates anything.
func TestBuildRefusedWithTheReason(t *testing.T) {
	for _, tc := range []struct {
		name    string
		image   string
		classes []string
		images  BaseArchiver
		why     string
	}{
		{"no builder image", "", []string{"runc", "gvisor"}, noArchives{}, "--builder-image"},
		{"no gvisor", "localhost/builder:1", []string{"runc"}, noArchives{}, `runtime class "gvisor"`},
		{"no base images", "localhost/builder:1", []string{"runc", "gvisor"}, nil, "base images"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := runtimetest.NewFake()
			t.Cleanup(f.Close)
			l := engineRunner(t, f, "")
			l.RuntimeClasses, l.BuilderImage, l.BuildImages = tc.classes, tc.image, tc.images
			_, err := l.Build(context.Background(), BuildRequest{Context: strings.NewReader("x"), Push: "reg/org/app:1"}, nil)
			if apierr.Reason(err) != apierr.BuildNotSupported || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("build: %v, want %s naming %q", err, apierr.BuildNotSupported, tc.why)
			}
			if n := len(l.R.List()); n != 0 {
				t.Errorf("%d sandboxes created", n)
			}
			c, err := l.Capacity(context.Background())
			if err != nil || c.BuilderImage != "" || !strings.Contains(c.BuildUnavailable, tc.why) {
				t.Errorf("capacity: builder image %q, why %q (%v), want none and %q", c.BuilderImage, c.BuildUnavailable, err, tc.why)
			}
		})
	}
}

// A runner that can build says so in its capacity, with its builder image.
func TestBuildCapacity(t *testing.T) {
	f := runtimetest.NewFake()
	t.Cleanup(f.Close)
	l := engineRunner(t, f, "")
	l.BuilderImage, l.BuildImages = "localhost/builder:1", noArchives{}
	c, err := l.Capacity(context.Background())
	if err != nil || c.BuilderImage != "localhost/builder:1" || c.BuildUnavailable != "" {
		t.Errorf("capacity: builder image %q, why %q (%v)", c.BuilderImage, c.BuildUnavailable, err)
	}
}

// TestBuildInvalid: bad options, a timeout beyond the bound, no push target or no
// context are INVALID_ARGUMENT with the field named, before a builder exists.
func TestBuildInvalid(t *testing.T) {
	f := runtimetest.NewFake()
	t.Cleanup(f.Close)
	l := engineRunner(t, f, "")
	l.BuilderImage, l.BuildImages = "localhost/builder:1", noArchives{}
	ok := BuildRequest{Context: strings.NewReader("x"), Push: "reg/org/app:1", OrganizationID: "org-1"}
	for _, tc := range []struct {
		field string
		edit  func(*BuildRequest)
	}{
		{"dockerfile", func(r *BuildRequest) { r.Options = imagebuild.Options{Dockerfile: "../x"} }},
		{"build_args", func(r *BuildRequest) { r.BuildArgs = map[string]string{"1": "x"} }},
		{"timeout_seconds", func(r *BuildRequest) { r.Timeout = MaxBuildTimeout + time.Second }},
		{"timeout_seconds", func(r *BuildRequest) { r.Timeout = -time.Second }},
		{"push", func(r *BuildRequest) { r.Push = "" }},
		{"context", func(r *BuildRequest) { r.Context = nil }},
		{"organization_id", func(r *BuildRequest) { r.OrganizationID = "" }},
		{"organization_id", func(r *BuildRequest) { r.OrganizationID = strings.Repeat("o", MaxOrganizationIDBytes+1) }},
		{"base_credentials_registry", func(r *BuildRequest) { r.BaseCredentials = &runtime.Credentials{Password: "t"} }},
	} {
		req := ok
		tc.edit(&req)
		_, err := l.Build(context.Background(), req, nil)
		vs := apierr.Violations(err)
		if apierr.Reason(err) != apierr.InvalidRequest || len(vs) == 0 || vs[0].Field != tc.field {
			t.Errorf("%s: %v (%v), want INVALID_REQUEST on %s", tc.field, err, vs, tc.field)
		}
	}
	if n := len(l.R.List()); n != 0 {
		t.Errorf("%d sandboxes created", n)
	}
}

// credsArchiver records the credentials each base image was asked for with.
type credsArchiver map[string]*runtime.Credentials

func (c credsArchiver) WriteArchive(_ context.Context, ref string, creds *runtime.Credentials, _ io.Writer, _ int64) error {
	c[ref] = creds
	return nil
}

// TestBuildBaseCredentialsBound: the organization's pull token reaches the image store
// for base images of the platform registry only (its host, port included, as
// distribution/reference normalizes a reference); a FROM naming any other registry (a
// look-alike host, another port, Docker Hub, a userinfo trick, garbage) is pulled with
// nil credentials, the store's own auth.
func TestBuildBaseCredentialsBound(t *testing.T) {
	token := &runtime.Credentials{Username: "sandboxd", Password: "org-pull-token"}
	for _, tc := range []struct {
		host string
		ref  string
		want bool
	}{
		{"reg.test:5000", "reg.test:5000/org-a/app:1", true},
		{"reg.test:5000", "reg.test:5000/org-a/app@sha256:" + strings.Repeat("a", 64), true},
		{"reg.test:5000", "reg.test:5000/org-b/app:1", true}, // the registry checks the org
		{"reg.test:5000", "attacker.example:5000/x", false},
		{"reg.test:5000", "reg.test:5001/org-a/app:1", false},
		{"reg.test:5000", "reg.test/org-a/app:1", false},
		{"reg.test:5000", "reg.test:5000.evil.example/org-a/app", false},
		{"reg.test:5000", "evil.example/reg.test:5000/org-a/app", false},
		{"reg.test:5000", "busybox", false},
		{"reg.test:5000", "docker.io/library/busybox:1", false},
		{"reg.test:5000", "user@reg.test:5000/x", false},
		{"reg.test:5000", "REG.TEST:5000/org-a/app", false},
		{"reg.test:5000", "", false},
		{"reg.test:5000", "reg.test:5000/../x", false},
		{"127.0.0.1:7443", "127.0.0.1:7443/org-a/app:1", true},
		{"127.0.0.1:7443", "localhost:7443/org-a/app:1", false},
		{"127.0.0.1:7443", "127.0.0.1:7444/org-a/app:1", false},
		{"[::1]:7443", "[::1]:7443/org-a/app:1", true},
		{"", "reg.test:5000/org-a/app:1", false}, // no host: never
	} {
		a := credsArchiver{}
		l := &Local{BuildImages: a}
		req := &BuildRequest{BaseCredentials: token, BaseCredentialsRegistry: tc.host}
		if err := l.writeBase(req)(context.Background(), tc.ref, io.Discard); err != nil {
			t.Fatal(err)
		}
		if got := a[tc.ref]; (got != nil) != tc.want || (got != nil && *got != *token) {
			t.Errorf("FROM %q with credentials for %q: the store got %v, want the token: %v", tc.ref, tc.host, got, tc.want)
		}
	}
}

// FuzzBuildBaseCredentials: whatever a Dockerfile names, the token goes only to a
// reference whose registry is the platform's, as the image store parses it too.
func FuzzBuildBaseCredentials(f *testing.F) {
	for _, s := range []string{"reg.test:5000/a/b:1", "busybox", "reg.test:5000.x/a", "a/reg.test:5000/b", "user@reg.test:5000/x", "reg.test:5000/A"} {
		f.Add(s)
	}
	req := &BuildRequest{BaseCredentials: &runtime.Credentials{Password: "t"}, BaseCredentialsRegistry: "reg.test:5000"}
	f.Fuzz(func(t *testing.T, ref string) {
		if req.baseCredentials(ref) == nil {
			return
		}
		r, err := name.ParseReference(ref)
		if err != nil || r.Context().RegistryStr() != "reg.test:5000" {
			t.Fatalf("credentials for %q (the store reads registry %v, %v)", ref, r, err)
		}
	})
}
