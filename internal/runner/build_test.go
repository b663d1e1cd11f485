package runner

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

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
