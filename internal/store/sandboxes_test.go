package store_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestSandboxesCRUDAndScoping(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		sb := s.Sandboxes()
		created := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("X", 3600))
		in := store.Sandbox{ID: "sb1", Org: "o1", RunnerID: "r1", RequestID: "req-1",
			Spec: json.RawMessage(`{"container": {"image": "python:3.12"}}`), Tags: []string{"a", "b", "a"},
			CreatedAt: created, State: "CREATING", PolicyRevision: 4}
		x, err := sb.Create(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(x.Tags, []string{"a", "b"}) || !x.CreatedAt.Equal(created.Truncate(time.Microsecond)) {
			t.Fatalf("create = %+v", x)
		}
		got, err := sb.Get(ctx, "o1", "sb1")
		if err != nil {
			t.Fatal(err)
		}
		wantUTC(t, got.CreatedAt, got.UpdatedAt)
		if got.ID != "sb1" || got.Org != "o1" || got.RunnerID != "r1" || got.RequestID != "req-1" ||
			string(got.Spec) != string(in.Spec) || !slices.Equal(got.Tags, []string{"a", "b"}) ||
			!got.CreatedAt.Equal(x.CreatedAt) || got.State != "CREATING" || got.PolicyRevision != 4 ||
			got.Status != nil || got.EndedAt != nil {
			t.Fatalf("get = %+v", got)
		}

		// Another organization sees nothing.
		_, err = sb.Get(ctx, "o2", "sb1")
		wantErr(t, err, store.ErrNotFound)
		_, err = sb.GetByRequestID(ctx, "o2", "req-1")
		wantErr(t, err, store.ErrNotFound)
		_, err = sb.UpdateStatus(ctx, "o2", "sb1", store.SandboxStatusUpdate{State: "RUNNING"})
		wantErr(t, err, store.ErrNotFound)
		if l, _, err := sb.List(ctx, "o2", store.SandboxFilter{IncludeTerminal: true}, store.Page{}); err != nil || len(l) != 0 {
			t.Fatalf("o2 list = %v, %v", l, err)
		}

		byReq, err := sb.GetByRequestID(ctx, "o1", "req-1")
		if err != nil || byReq.ID != "sb1" {
			t.Fatalf("by request = %+v, %v", byReq, err)
		}
		_, err = sb.GetByRequestID(ctx, "o1", "")
		wantErr(t, err, store.ErrNotFound)

		// Uniqueness: id globally, request_id per organization; empty request ids never collide.
		_, err = sb.Create(ctx, store.Sandbox{ID: "sb1", Org: "o2", RunnerID: "r", State: "PENDING"})
		wantKey(t, err, store.KeyID)
		_, err = sb.Create(ctx, store.Sandbox{ID: "sb2", Org: "o1", RunnerID: "r", RequestID: "req-1", State: "PENDING"})
		wantKey(t, err, store.KeyRequestID)
		for _, c := range []store.Sandbox{
			{ID: "sb3", Org: "o2", RunnerID: "r", RequestID: "req-1", State: "PENDING"},
			{ID: "sb4", Org: "o1", RunnerID: "r", State: "PENDING"},
			{ID: "sb5", Org: "o1", RunnerID: "r", State: "PENDING"},
		} {
			if _, err := sb.Create(ctx, c); err != nil {
				t.Fatalf("create %s: %v", c.ID, err)
			}
		}
		_, err = sb.Create(ctx, store.Sandbox{ID: "sb6", Org: "o1", RunnerID: "r", State: "PENDING", Spec: json.RawMessage(`{`)})
		wantErr(t, err, store.ErrInvalid)

		// Status updates; EndedAt, once set, stays.
		up, err := sb.UpdateStatus(ctx, "o1", "sb1", store.SandboxStatusUpdate{State: "RUNNING", Status: json.RawMessage(`{"ip":"10.0.0.2"}`)})
		if err != nil || up.State != "RUNNING" || string(up.Status) != `{"ip":"10.0.0.2"}` || up.EndedAt != nil {
			t.Fatalf("update = %+v, %v", up, err)
		}
		end := time.Now().Add(-time.Minute)
		up, err = sb.UpdateStatus(ctx, "o1", "sb1", store.SandboxStatusUpdate{State: "COMPLETED", EndedAt: &end})
		if err != nil || up.State != "COMPLETED" || string(up.Status) != `{"ip":"10.0.0.2"}` || up.EndedAt == nil ||
			!up.EndedAt.Equal(end.Truncate(time.Microsecond)) {
			t.Fatalf("terminal update = %+v, %v", up, err)
		}
		later := time.Now()
		up, err = sb.UpdateStatus(ctx, "o1", "sb1", store.SandboxStatusUpdate{State: "TERMINATED", EndedAt: &later})
		if err != nil || !up.EndedAt.Equal(end.Truncate(time.Microsecond)) {
			t.Fatalf("ended_at moved: %+v, %v", up, err)
		}
		_, err = sb.UpdateStatus(ctx, "o1", "missing", store.SandboxStatusUpdate{State: "RUNNING"})
		wantErr(t, err, store.ErrNotFound)
	})
}

// TestSandboxUpdateStatusRunnerID: a sandbox that moved to another runner (ResumeSandbox
// elsewhere) has its runner_id changed by UpdateStatus; an update without RunnerID
// leaves it, and another organization cannot move it.
func TestSandboxUpdateStatusRunnerID(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		sb := s.Sandboxes()
		if _, err := sb.Create(ctx, store.Sandbox{ID: "sb1", Org: "o1", RunnerID: "r1", RequestID: "req-1", State: "PAUSED",
			CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		_, err := sb.UpdateStatus(ctx, "o2", "sb1", store.SandboxStatusUpdate{State: "RUNNING", RunnerID: "r9"})
		wantErr(t, err, store.ErrNotFound)
		up, err := sb.UpdateStatus(ctx, "o1", "sb1", store.SandboxStatusUpdate{State: "RUNNING", Status: json.RawMessage(`{"ip":"10.0.0.3"}`), RunnerID: "r2"})
		if err != nil || up.RunnerID != "r2" || up.State != "RUNNING" {
			t.Fatalf("move = %+v, %v", up, err)
		}
		for _, get := range []func() (store.Sandbox, error){
			func() (store.Sandbox, error) { return sb.Get(ctx, "o1", "sb1") },
			func() (store.Sandbox, error) { return sb.GetByRequestID(ctx, "o1", "req-1") },
		} {
			if got, err := get(); err != nil || got.RunnerID != "r2" {
				t.Fatalf("after the move = %+v, %v", got, err)
			}
		}
		if l, _, err := sb.List(ctx, "o1", store.SandboxFilter{}, store.Page{}); err != nil || len(l) != 1 || l[0].RunnerID != "r2" {
			t.Fatalf("list after the move = %+v, %v", l, err)
		}
		up, err = sb.UpdateStatus(ctx, "o1", "sb1", store.SandboxStatusUpdate{State: "PAUSED"})
		if err != nil || up.RunnerID != "r2" || string(up.Status) != `{"ip":"10.0.0.3"}` {
			t.Fatalf("an update without RunnerID = %+v, %v, want runner r2 kept", up, err)
		}
	})
}

func TestSandboxListFiltersAndPagination(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		sb := s.Sandboxes()
		base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		ended := base.Add(time.Hour)
		type row struct {
			runner, state string
			tags          []string
			terminal      bool
		}
		// 30 sandboxes; every third pair shares a created_at, to exercise the id tiebreak.
		var all []string
		for i := range 30 {
			r := row{runner: fmt.Sprintf("r%d", i%3), state: []string{"RUNNING", "PENDING", "COMPLETED"}[i%3],
				tags: [][]string{{"x"}, {"x", "y"}, {"y"}, nil}[i%4], terminal: i%3 == 2}
			x := store.Sandbox{ID: fmt.Sprintf("sb%02d", i), Org: "o1", RunnerID: r.runner, State: r.state, Tags: r.tags,
				CreatedAt: base.Add(time.Duration(i/2) * time.Second)}
			if r.terminal {
				x.EndedAt = &ended
			}
			if _, err := sb.Create(ctx, x); err != nil {
				t.Fatal(err)
			}
			all = append(all, x.ID)
		}
		if _, err := sb.Create(ctx, store.Sandbox{ID: "other", Org: "o2", RunnerID: "r0", State: "RUNNING", Tags: []string{"x"}}); err != nil {
			t.Fatal(err)
		}
		pick := func(keep func(i int) bool) []string {
			var out []string
			for i, id := range all {
				if keep(i) {
					out = append(out, id)
				}
			}
			return out
		}
		hasTags := func(i int, want ...string) bool {
			tags := [][]string{{"x"}, {"x", "y"}, {"y"}, nil}[i%4]
			for _, w := range want {
				if !slices.Contains(tags, w) {
					return false
				}
			}
			return true
		}
		live := func(i int) bool { return i%3 != 2 }
		cases := []struct {
			name string
			f    store.SandboxFilter
			want []string
		}{
			{"live", store.SandboxFilter{}, pick(live)},
			{"all", store.SandboxFilter{IncludeTerminal: true}, all},
			{"tag x", store.SandboxFilter{Tags: []string{"x"}}, pick(func(i int) bool { return live(i) && hasTags(i, "x") })},
			{"tags x AND y", store.SandboxFilter{Tags: []string{"x", "y"}, IncludeTerminal: true},
				pick(func(i int) bool { return hasTags(i, "x", "y") })},
			{"state", store.SandboxFilter{States: []string{"PENDING"}}, pick(func(i int) bool { return i%3 == 1 })},
			{"states incl terminal", store.SandboxFilter{States: []string{"RUNNING", "COMPLETED"}, IncludeTerminal: true},
				pick(func(i int) bool { return i%3 != 1 })},
			{"runners", store.SandboxFilter{RunnerIDs: []string{"r0", "r2"}, IncludeTerminal: true},
				pick(func(i int) bool { return i%3 != 1 })},
			{"runner and tag", store.SandboxFilter{RunnerIDs: []string{"r1"}, Tags: []string{"y"}},
				pick(func(i int) bool { return i%3 == 1 && hasTags(i, "y") })},
			{"nothing", store.SandboxFilter{Tags: []string{"nope"}}, nil},
		}
		for _, c := range cases {
			for _, size := range []int{1, 4, 7, 100} {
				for _, desc := range []bool{false, true} {
					f := c.f
					f.Descending = desc
					want := slices.Clone(c.want)
					if desc {
						slices.Reverse(want)
					}
					var got []string
					tok := ""
					for pages := 0; ; pages++ {
						if pages > 40 {
							t.Fatalf("%s: pagination does not end", c.name)
						}
						page, next, err := sb.List(ctx, "o1", f, store.Page{Size: size, Token: tok})
						if err != nil {
							t.Fatal(err)
						}
						if len(page) > size {
							t.Fatalf("%s: page of %d, size %d", c.name, len(page), size)
						}
						for _, x := range page {
							got = append(got, x.ID)
						}
						if next == "" {
							break
						}
						tok = next
					}
					if !slices.Equal(got, want) {
						t.Fatalf("%s size %d desc %v:\n got %v\nwant %v", c.name, size, desc, got, want)
					}
				}
			}
		}

		// A record created between pages, before the cursor, does not shift later pages.
		page1, next, err := sb.List(ctx, "o1", store.SandboxFilter{IncludeTerminal: true}, store.Page{Size: 10})
		if err != nil || len(page1) != 10 {
			t.Fatal(err)
		}
		if _, err := sb.Create(ctx, store.Sandbox{ID: "early", Org: "o1", RunnerID: "r0", State: "RUNNING", CreatedAt: base.Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
		page2, _, err := sb.List(ctx, "o1", store.SandboxFilter{IncludeTerminal: true}, store.Page{Size: 10, Token: next})
		if err != nil || len(page2) != 10 || page2[0].ID != all[10] {
			t.Fatalf("page 2 = %v, %v", page2, err)
		}
		_, _, err = sb.List(ctx, "o1", store.SandboxFilter{}, store.Page{Token: "bm90LWEtY3Vyc29y"})
		wantErr(t, err, store.ErrInvalid)
	})
}

func TestSandboxCleanupByCutoff(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		sb := s.Sandboxes()
		cutoff := time.Now().Add(-time.Hour)
		endedAt := func(d time.Duration) *time.Time { e := cutoff.Add(d); return &e }
		for _, c := range []struct {
			id    string
			ended *time.Time
		}{
			{"old1", endedAt(-time.Minute)},
			{"old2", endedAt(-48 * time.Hour)},
			{"recent", endedAt(time.Minute)},
			{"live", nil},
		} {
			for _, org := range []string{"o1", "o2"} {
				if _, err := sb.Create(ctx, store.Sandbox{ID: org + "-" + c.id, Org: org, RunnerID: "r", State: "X",
					Tags: []string{"t"}, RequestID: c.id, EndedAt: c.ended, CreatedAt: cutoff.Add(-72 * time.Hour)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		n, err := sb.DeleteEndedBefore(ctx, cutoff)
		if err != nil || n != 4 {
			t.Fatalf("deleted %d, %v; want 4", n, err)
		}
		for _, org := range []string{"o1", "o2"} {
			l, _, err := sb.List(ctx, org, store.SandboxFilter{IncludeTerminal: true, Tags: []string{"t"}}, store.Page{})
			if err != nil || len(l) != 2 || l[0].ID != org+"-recent" && l[1].ID != org+"-recent" {
				t.Fatalf("%s left: %+v, %v", org, l, err)
			}
			_, err = sb.GetByRequestID(ctx, org, "old1")
			wantErr(t, err, store.ErrNotFound)
			// The request id is free again.
			if _, err := sb.Create(ctx, store.Sandbox{ID: org + "-new", Org: org, RunnerID: "r", State: "X", RequestID: "old1"}); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := sb.DeleteEndedBefore(ctx, cutoff); err != nil || n != 0 {
			t.Fatalf("second cleanup: %d, %v", n, err)
		}
	})
}
