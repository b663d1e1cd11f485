package sbxcli

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/store"
)

// `sbx admin runner get` shows the runner's image pre-pull as its heartbeat (here an
// in-process runner's, controlplane.Beat) reported it: a summary and a line per image;
// -o json carries the field.
func TestSbxAdminRunnerShowsPrepull(t *testing.T) {
	admin, _, st := controlPlaneStore(t)
	ctx := t.Context()
	if _, err := st.Runners().Create(ctx, store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c1", Zone: "z"}); err != nil {
		t.Fatal(err)
	}
	next := timestamppb.New(time.Now().Add(time.Minute))
	err := controlplane.Beat(ctx, st, "o1", "r1", controlplane.Status{Version: "v0.9.0", Ready: true, Prepull: &controlplanev1.PrepullStatus{
		LeftOut: 2,
		Images: []*controlplanev1.ImagePrepull{
			{Image: "busybox:1", OrganizationId: "o1", TemplateId: "tmpl-1", State: controlplanev1.PrepullState_PREPULL_PRESENT, NodesPresent: 3, NodesTotal: 3},
			{Image: "reg.example/o1/app:2", OrganizationId: "o1", TemplateId: "tmpl-2", State: controlplanev1.PrepullState_PREPULL_FAILED,
				NodesPresent: 1, NodesTotal: 3, LastError: "ErrImagePull: manifest unknown", NextAttemptTime: next},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sbx := func(args ...string) string {
		t.Helper()
		out, errs, code := runSbx(context.Background(), "", append(append([]string{}, admin...), args...)...)
		if code != 0 {
			t.Fatalf("sbx %q: %d %s", args, code, errs)
		}
		return out
	}
	out := sbx("admin", "runner", "get", "r1")
	for _, want := range []string{
		"Image pre-pull:", "2 image(s): 1 present, 0 pulling, 0 pending, 1 failed; 2 more not listed",
		"busybox:1, PRESENT, template o1/tmpl-1, on 3 of 3 nodes",
		"reg.example/o1/app:2, FAILED, template o1/tmpl-2, on 1 of 3 nodes, error: ErrImagePull: manifest unknown, next " + ts(next),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("runner get lacks %q:\n%s", want, out)
		}
	}
	if js := sbx("-o", "json", "admin", "runner", "get", "r1"); !strings.Contains(js, `"prepull"`) || !strings.Contains(js, `"PREPULL_FAILED"`) {
		t.Errorf("json lacks the pre-pull status:\n%s", js)
	}

	// A bad status from an in-process runner is not recorded.
	bad := controlplane.Status{Version: "v0.9.0", Prepull: &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{{Image: "x"}}}}
	if err := controlplane.Beat(ctx, st, "o1", "r1", bad); err == nil {
		t.Fatal("a pre-pull status without state recorded")
	}
}
