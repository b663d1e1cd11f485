package gateway

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/store"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// TestBuildRetention: a sweep (driven by a fake clock, not by waiting) deletes ended builds
// older than the retention and, beyond the per-organization bound, the oldest ended ones,
// with their logs (GetBuild and StreamBuildLogs answer NOT_FOUND); queued and running
// builds and another organization's within bounds stay.
func TestBuildRetention(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1"}
	r.build = okBuild(testDigest)
	clock := &fakeClock{t: time.Now()}
	e := newBuildEnv(t, t.TempDir(), func(o *BuildOptions) {
		o.Retention, o.Keep, o.SweepInterval, o.Now = 30*24*time.Hour, 3, -1, clock.now
	}, r)
	bs := e.st.Builds()

	// One real build through the API, ended SUCCEEDED with its log.
	res, err := e.c.StartBuild(ctx, as(e.admin, buildReq("py", "ctx")))
	if err != nil {
		t.Fatal(err)
	}
	built := res.Msg.GetBuild().GetBuildId()
	e.waitBuild(t, built, buildv1.BuildState_BUILD_STATE_SUCCEEDED)
	if evs, err := e.logs(t, e.admin, built, 0, false); err != nil || len(evs) < 3 {
		t.Fatalf("log of the build: %d events, %v", len(evs), err)
	}
	// Stored builds: testOrg has the real one and 4 more ended, one queued, one running;
	// org-b has 2 ended.
	mk := func(id, org string, state buildv1.BuildState) {
		t.Helper()
		rec, _ := proto.Marshal(&buildv1.Build{BuildId: id, State: state})
		if _, err := bs.Create(ctx, store.Build{ID: id, Org: org, State: int32(state), Record: rec}); err != nil {
			t.Fatal(err)
		}
		if err := bs.AppendEvents(ctx, id, 1, [][]byte{rec}); err != nil {
			t.Fatal(err)
		}
	}
	for i, st := range []buildv1.BuildState{buildv1.BuildState_BUILD_STATE_FAILED, buildv1.BuildState_BUILD_STATE_CANCELLED,
		buildv1.BuildState_BUILD_STATE_SUCCEEDED, buildv1.BuildState_BUILD_STATE_SUCCEEDED} {
		mk(fmt.Sprintf("ended-%d", i), testOrg, st)
	}
	mk("queued", testOrg, buildv1.BuildState_BUILD_STATE_QUEUED)
	mk("running", testOrg, buildv1.BuildState_BUILD_STATE_RUNNING)
	mk("b-0", "org-b", buildv1.BuildState_BUILD_STATE_FAILED)
	mk("b-1", "org-b", buildv1.BuildState_BUILD_STATE_SUCCEEDED)
	ids := func(org string) string {
		t.Helper()
		list, _, err := bs.List(ctx, org, "", store.Page{Size: 100})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range list {
			if b.ID == built {
				out = append(out, "built")
				continue
			}
			out = append(out, b.ID)
		}
		return fmt.Sprint(out)
	}

	// Within the retention: only the bound applies. testOrg has 5 ended builds, keeps 3:
	// the real build and ended-0 (the oldest) go.
	if n, err := e.s.builds.sweep(ctx); err != nil || n != 2 {
		t.Fatalf("sweep within the retention: %d, %v", n, err)
	}
	if got := ids(testOrg); got != "[running queued ended-3 ended-2 ended-1]" {
		t.Fatalf("%s after the bound: %s", testOrg, got)
	}
	if got := ids("org-b"); got != "[b-1 b-0]" {
		t.Fatalf("org-b after the bound: %s", got)
	}
	_, err = e.c.GetBuild(ctx, as(e.admin, &buildv1.GetBuildRequest{BuildId: built}))
	wantBuildErr(t, err, connect.CodeNotFound, apierr.BuildNotFound, "")
	if _, err := e.logs(t, e.admin, built, 0, false); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("log of a deleted build: %v", err)
	}
	if evs, err := bs.Events(ctx, built, 0, 100); err != nil || len(evs) != 0 {
		t.Fatalf("stored events of a deleted build: %d, %v", len(evs), err)
	}
	// Nothing more is due now.
	if n, err := e.s.builds.sweep(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v", n, err)
	}
	// 31 days on, every ended build is past the retention; queued and running stay.
	clock.set(time.Now().Add(31 * 24 * time.Hour))
	if n, err := e.s.builds.sweep(ctx); err != nil || n != 5 {
		t.Fatalf("sweep past the retention: %d, %v", n, err)
	}
	if got := ids(testOrg); got != "[running queued]" {
		t.Fatalf("%s past the retention: %s", testOrg, got)
	}
	if got := ids("org-b"); got != "[]" {
		t.Fatalf("org-b past the retention: %s", got)
	}
	if evs, err := bs.Events(ctx, "queued", 0, 100); err != nil || len(evs) != 1 {
		t.Fatalf("events of the queued build: %d, %v", len(evs), err)
	}
}

// TestBuildRetentionOff: without Retention and Keep nothing is deleted.
func TestBuildRetentionOff(t *testing.T) {
	e := newBuildEnv(t, t.TempDir(), func(o *BuildOptions) { o.Now = func() time.Time { return time.Now().Add(10 * 365 * 24 * time.Hour) } }, &acceptingRunner{id: "r1"})
	ctx := t.Context()
	if _, err := e.st.Builds().Create(ctx, store.Build{ID: "old", Org: testOrg, State: int32(buildv1.BuildState_BUILD_STATE_SUCCEEDED), Record: []byte{}}); err != nil {
		t.Fatal(err)
	}
	if n, err := e.s.builds.sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	if _, err := e.st.Builds().Get(ctx, testOrg, "old"); err != nil {
		t.Fatal(err)
	}
}
