package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestBuilds(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		bs := s.Builds()
		a, err := bs.Create(ctx, store.Build{ID: "b1", Org: "acme", State: 1, Template: "py", Record: []byte{0x0a, 0x02, 'b', '1'}, RequestID: "r1", RequestDigest: "d1"})
		if err != nil || a.CreateTime.IsZero() || !a.UpdateTime.Equal(a.CreateTime) {
			t.Fatalf("create = %+v, %v", a, err)
		}
		got, err := bs.Get(ctx, "acme", "b1")
		if err != nil || got.State != 1 || got.Template != "py" || string(got.Record) != "\x0a\x02b1" || got.RequestDigest != "d1" || !got.CreateTime.Equal(a.CreateTime) {
			t.Fatalf("get = %+v, %v", got, err)
		}
		// Another organization's is not found, by ID or request_id.
		_, err = bs.Get(ctx, "globex", "b1")
		wantErr(t, err, store.ErrNotFound)
		_, err = bs.GetByRequestID(ctx, "globex", "r1")
		wantErr(t, err, store.ErrNotFound)
		_, err = bs.GetByRequestID(ctx, "acme", "")
		wantErr(t, err, store.ErrNotFound)
		if g, err := bs.GetByRequestID(ctx, "acme", "r1"); err != nil || g.ID != "b1" {
			t.Fatalf("by request = %+v, %v", g, err)
		}
		// A request_id starts one build per organization; the ID is unique.
		var dup *store.AlreadyExistsError
		if _, err := bs.Create(ctx, store.Build{ID: "b2", Org: "acme", Record: []byte{}, RequestID: "r1"}); !errors.As(err, &dup) {
			t.Fatalf("repeated request_id: %v", err)
		}
		if _, err := bs.Create(ctx, store.Build{ID: "b1", Org: "globex", Record: []byte{}}); !errors.As(err, &dup) {
			t.Fatalf("repeated id: %v", err)
		}
		if _, err := bs.Create(ctx, store.Build{ID: "b9", Org: "acme"}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("no record: %v", err)
		}

		// Update replaces state and record, in the build's organization only.
		u, err := bs.Update(ctx, "acme", "b1", 3, []byte("done"))
		if err != nil || u.State != 3 || string(u.Record) != "done" || u.UpdateTime.Before(u.CreateTime) {
			t.Fatalf("update = %+v, %v", u, err)
		}
		_, err = bs.Update(ctx, "globex", "b1", 4, []byte("x"))
		wantErr(t, err, store.ErrNotFound)

		// List: newest first, by template, in pages.
		for i := 2; i <= 5; i++ {
			tpl := ""
			if i%2 == 0 {
				tpl = "py"
			}
			if _, err := bs.Create(ctx, store.Build{ID: fmt.Sprintf("b%d", i), Org: "acme", Template: tpl, Record: []byte{}}); err != nil {
				t.Fatal(err)
			}
		}
		var ids []string
		token := ""
		for pages := 0; ; pages++ {
			page, next, err := bs.List(ctx, "acme", "", store.Page{Size: 2, Token: token})
			if err != nil || pages > 5 {
				t.Fatalf("list: %v (%d pages)", err, pages)
			}
			for _, b := range page {
				ids = append(ids, b.ID)
			}
			if next == "" {
				break
			}
			token = next
		}
		if fmt.Sprint(ids) != "[b5 b4 b3 b2 b1]" {
			t.Errorf("listed %v", ids)
		}
		py, _, err := bs.List(ctx, "acme", "py", store.Page{})
		if err != nil || len(py) != 3 || py[0].ID != "b4" || py[1].ID != "b2" || py[2].ID != "b1" {
			t.Errorf("template py: %+v, %v", py, err)
		}
		if other, _, err := bs.List(ctx, "globex", "", store.Page{}); err != nil || len(other) != 0 { // its b1 was refused
			t.Errorf("globex: %+v, %v", other, err)
		}
		if _, _, err := bs.List(ctx, "acme", "", store.Page{Token: "not-ours"}); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("foreign token: %v", err)
		}

		// InStates: every organization's, oldest first (b1 is 3 now, b2..b5 0).
		if _, err := bs.Create(ctx, store.Build{ID: "g1", Org: "globex", State: 2, Record: []byte{}}); err != nil {
			t.Fatal(err)
		}
		if in, err := bs.InStates(ctx, []int32{1, 2}, 0); err != nil || len(in) != 1 || in[0].ID != "g1" || in[0].Org != "globex" {
			t.Errorf("in states 1, 2: %+v, %v", in, err)
		}
		if in, err := bs.InStates(ctx, []int32{0, 3}, 2); err != nil || len(in) != 2 || in[0].ID != "b1" || in[1].ID != "b2" {
			t.Errorf("in states 0, 3 (2 at most): %+v, %v", in, err)
		}

		// Events: numbered from 1, appended in order, read after a number.
		if err := bs.AppendEvents(ctx, "b1", 1, [][]byte{[]byte("e1"), []byte("e2")}); err != nil {
			t.Fatal(err)
		}
		if err := bs.AppendEvents(ctx, "b1", 3, [][]byte{[]byte("e3")}); err != nil {
			t.Fatal(err)
		}
		wantErr(t, bs.AppendEvents(ctx, "b1", 3, [][]byte{[]byte("again")}), store.ErrConflict)
		wantErr(t, bs.AppendEvents(ctx, "b1", 0, [][]byte{[]byte("zero")}), store.ErrInvalid)
		evs, err := bs.Events(ctx, "b1", 1, 0)
		if err != nil || len(evs) != 2 || evs[0].Seq != 2 || string(evs[0].Event) != "e2" || evs[1].Seq != 3 {
			t.Errorf("events after 1: %+v, %v", evs, err)
		}
		if evs, err := bs.Events(ctx, "b1", 0, 1); err != nil || len(evs) != 1 || string(evs[0].Event) != "e1" {
			t.Errorf("first event: %+v, %v", evs, err)
		}
		if evs, err := bs.Events(ctx, "b2", 0, 0); err != nil || len(evs) != 0 {
			t.Errorf("events of b2: %+v, %v", evs, err)
		}
	})
}

// TestBuildsDeleteEnded: builds in an ended state last updated before the cut-off go, then
// each organization's ended builds beyond its newest keep (by create time), in batches of
// limit, with their events; queued and running builds never, whatever their age.
func TestBuildsDeleteEnded(t *testing.T) {
	const queued, running, succeeded, failed, cancelled = 1, 2, 3, 4, 5
	ended := []int32{succeeded, failed, cancelled}
	eachBackend(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn)
		defer s.Close()
		ctx := t.Context()
		bs := s.Builds()
		base := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
		// setTimes gives build id create and update times day days after base.
		setTimes := func(id string, day int) {
			at := base.AddDate(0, 0, day)
			if strings.HasPrefix(dsn, "postgres://") {
				rawExec(t, dsn, fmt.Sprintf(`UPDATE builds SET create_time = '%s', update_time = '%s' WHERE id = '%s'`, at.Format(time.RFC3339), at.Format(time.RFC3339), id))
			} else {
				rawExec(t, dsn, fmt.Sprintf(`UPDATE builds SET create_time = %d, update_time = %d WHERE id = '%s'`, at.UnixMicro(), at.UnixMicro(), id))
			}
		}
		mk := func(id, org string, state int32, day int) {
			t.Helper()
			if _, err := bs.Create(ctx, store.Build{ID: id, Org: org, State: state, Record: []byte{}}); err != nil {
				t.Fatal(err)
			}
			if err := bs.AppendEvents(ctx, id, 1, [][]byte{[]byte("e1"), []byte("e2")}); err != nil {
				t.Fatal(err)
			}
			setTimes(id, day)
		}
		// acme: old ended (days 0-2), old queued/running (days 0, 1), newer ended (days 10-14).
		mk("old-ok", "acme", succeeded, 0)
		mk("old-fail", "acme", failed, 1)
		mk("old-cancel", "acme", cancelled, 2)
		mk("old-queued", "acme", queued, 0)
		mk("old-running", "acme", running, 1)
		for i := 10; i < 15; i++ {
			mk(fmt.Sprintf("acme-%d", i), "acme", succeeded, i)
		}
		// globex: three newer ended builds.
		for i := 10; i < 13; i++ {
			mk(fmt.Sprintf("globex-%d", i), "globex", failed, i)
		}
		left := func(org string) []string {
			t.Helper()
			list, _, err := bs.List(ctx, org, "", store.Page{Size: 100})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, b := range list {
				ids = append(ids, b.ID)
			}
			return ids
		}

		// Nothing is due: a cut-off before everything, no count bound.
		if n, err := bs.DeleteEnded(ctx, ended, base, 0, 100); err != nil || n != 0 {
			t.Fatalf("nothing due: %d, %v", n, err)
		}
		// By age, in batches of 2: the three old ended builds of acme (day < 5).
		n, err := bs.DeleteEnded(ctx, ended, base.AddDate(0, 0, 5), 0, 2)
		if err != nil || n != 2 {
			t.Fatalf("first batch: %d, %v", n, err)
		}
		if n, err := bs.DeleteEnded(ctx, ended, base.AddDate(0, 0, 5), 0, 2); err != nil || n != 1 {
			t.Fatalf("second batch: %d, %v", n, err)
		}
		if got := fmt.Sprint(left("acme")); got != "[acme-14 acme-13 acme-12 acme-11 acme-10 old-running old-queued]" {
			t.Fatalf("acme after the age cut: %s", got)
		}
		for _, id := range []string{"old-ok", "old-fail", "old-cancel"} {
			if evs, err := bs.Events(ctx, id, 0, 10); err != nil || len(evs) != 0 {
				t.Fatalf("events of deleted %s: %v, %v", id, evs, err)
			}
		}
		// By count: acme keeps its newest 2 ended (the queued and running builds do not
		// count and stay); globex (3) keeps 2.
		if n, err := bs.DeleteEnded(ctx, ended, time.Time{}, 2, 100); err != nil || n != 4 {
			t.Fatalf("count bound: %d, %v", n, err)
		}
		if got := fmt.Sprint(left("acme")); got != "[acme-14 acme-13 old-running old-queued]" {
			t.Fatalf("acme after the count bound: %s", got)
		}
		if got := fmt.Sprint(left("globex")); got != "[globex-12 globex-11]" {
			t.Fatalf("globex after the count bound: %s", got)
		}
		if evs, err := bs.Events(ctx, "acme-14", 0, 10); err != nil || len(evs) != 2 {
			t.Fatalf("events of a kept build: %v, %v", evs, err)
		}
		// Whatever the cut-off and bound, queued and running builds stay.
		if _, err := bs.DeleteEnded(ctx, ended, base.AddDate(1, 0, 0), 1, 100); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(left("acme")); got != "[old-running old-queued]" {
			t.Fatalf("acme at the end: %s", got)
		}
	})
}
