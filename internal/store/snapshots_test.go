package store_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/store"
)

func newSnap(id, org, requestID string) store.Snapshot {
	return store.Snapshot{ID: id, Org: org, SourceSandboxID: "sb1", SourceVolumeName: "workspace", Trigger: store.TriggerManual,
		ObjectBucket: "local", ObjectKey: "fss/" + org + "/" + id + ".tar.zst", RunnerID: "r1", RequestID: requestID}
}

// TestSnapshotsLifecycleAndScoping: a snapshot is created CREATING (idempotent on its
// request_id per organization), completes once, moves to DELETING only from READY or
// FAILED, and its row goes only once DELETING; another organization sees none of it.
func TestSnapshotsLifecycleAndScoping(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		sn := s.Snapshots()
		created := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("X", 3600))
		in := newSnap("fs1", "o1", "req-1")
		in.CreateTime = created
		x, ok, err := sn.Create(ctx, in)
		if err != nil || !ok {
			t.Fatalf("create: %v %v", ok, err)
		}
		if x.State != store.SnapshotCreating || !x.CreateTime.Equal(created.Truncate(time.Microsecond)) {
			t.Fatalf("create = %+v", x)
		}
		got, err := sn.Get(ctx, "o1", "fs1")
		if err != nil {
			t.Fatal(err)
		}
		wantUTC(t, got.CreateTime, got.UpdatedAt)
		if got.ID != "fs1" || got.Org != "o1" || got.State != store.SnapshotCreating || got.RequestID != "req-1" ||
			got.SourceSandboxID != "sb1" || got.SourceVolumeName != "workspace" || got.Trigger != store.TriggerManual ||
			got.ObjectBucket != "local" || got.ObjectKey != "fss/o1/fs1.tar.zst" || got.RunnerID != "r1" || got.CompleteTime != nil {
			t.Fatalf("get = %+v", got)
		}

		// The same request_id in the same organization returns the first snapshot.
		again, ok, err := sn.Create(ctx, newSnap("fs2", "o1", "req-1"))
		if err != nil || ok || again.ID != "fs1" {
			t.Fatalf("replayed create = %+v, created %v, %v; want fs1, not created", again, ok, err)
		}
		if _, err := sn.Get(ctx, "o1", "fs2"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a replay inserted a row: %v", err)
		}
		// In another organization it is another snapshot; empty request ids never collide.
		if _, ok, err := sn.Create(ctx, newSnap("fs3", "o2", "req-1")); err != nil || !ok {
			t.Fatalf("o2 create: %v %v", ok, err)
		}
		for _, id := range []string{"fs4", "fs5"} {
			if _, ok, err := sn.Create(ctx, newSnap(id, "o1", "")); err != nil || !ok {
				t.Fatalf("create %s: %v %v", id, ok, err)
			}
		}
		_, _, err = sn.Create(ctx, newSnap("fs1", "o2", ""))
		wantKey(t, err, store.KeyID)
		bad := newSnap("fs9", "o1", "")
		bad.Trigger = "SOMETIMES"
		_, _, err = sn.Create(ctx, bad)
		wantErr(t, err, store.ErrInvalid)

		// Another organization sees nothing of o1's.
		_, err = sn.Get(ctx, "o2", "fs1")
		wantErr(t, err, store.ErrNotFound)
		_, err = sn.GetByRequestID(ctx, "o2", "req-1")
		if err != nil {
			t.Fatal(err)
		}
		_, err = sn.Complete(ctx, "o2", "fs1", store.SnapshotCompletion{State: store.SnapshotReady})
		wantErr(t, err, store.ErrNotFound)
		_, err = sn.MarkDeleting(ctx, "o2", "fs1")
		wantErr(t, err, store.ErrNotFound)
		wantErr(t, sn.Delete(ctx, "o2", "fs1"), store.ErrNotFound)

		// CREATING cannot be deleted; it completes once.
		_, err = sn.MarkDeleting(ctx, "o1", "fs1")
		wantErr(t, err, store.ErrConflict)
		wantErr(t, sn.Delete(ctx, "o1", "fs1"), store.ErrConflict)
		done := time.Date(2026, 3, 1, 12, 0, 5, 0, time.UTC)
		r, err := sn.Complete(ctx, "o1", "fs1", store.SnapshotCompletion{State: store.SnapshotReady, SizeBytes: 1000,
			ContentBytes: 4000, Digest: "ab", Pause: 7 * time.Millisecond, CompleteTime: done})
		if err != nil {
			t.Fatal(err)
		}
		if r.State != store.SnapshotReady || r.SizeBytes != 1000 || r.ContentBytes != 4000 || r.Digest != "ab" ||
			r.Pause != 7*time.Millisecond || r.CompleteTime == nil || !r.CompleteTime.Equal(done) {
			t.Fatalf("complete = %+v", r)
		}
		_, err = sn.Complete(ctx, "o1", "fs1", store.SnapshotCompletion{State: store.SnapshotFailed})
		wantErr(t, err, store.ErrConflict)
		_, err = sn.Complete(ctx, "o1", "fs4", store.SnapshotCompletion{State: store.SnapshotDeleting})
		wantErr(t, err, store.ErrInvalid)
		f, err := sn.Complete(ctx, "o1", "fs4", store.SnapshotCompletion{State: store.SnapshotFailed,
			Reason: "CWSANDBOX_FSS_CREATE_FAILED", StateReason: "disk full"})
		if err != nil || f.State != store.SnapshotFailed || f.Reason != "CWSANDBOX_FSS_CREATE_FAILED" || f.StateReason != "disk full" {
			t.Fatalf("fail = %+v, %v", f, err)
		}

		// Usage counts what is not FAILED.
		n, bytes, err := sn.SnapshotUsage(ctx, "o1")
		if err != nil || n != 2 || bytes != 1000 {
			t.Fatalf("usage = %d, %d, %v; want 2 snapshots (fs1, fs5), 1000 bytes", n, bytes, err)
		}

		// READY and FAILED → DELETING (twice is fine) → gone.
		for _, id := range []string{"fs1", "fs4"} {
			for range 2 {
				d, err := sn.MarkDeleting(ctx, "o1", id)
				if err != nil || d.State != store.SnapshotDeleting {
					t.Fatalf("mark deleting %s = %+v, %v", id, d, err)
				}
			}
		}
		dels, err := sn.ListState(ctx, store.SnapshotDeleting, 0)
		if err != nil || len(dels) != 2 || dels[0].ID != "fs1" {
			t.Fatalf("DELETING = %v, %v", dels, err)
		}
		if err := sn.Delete(ctx, "o1", "fs1"); err != nil {
			t.Fatal(err)
		}
		_, err = sn.Get(ctx, "o1", "fs1")
		wantErr(t, err, store.ErrNotFound)
		wantErr(t, sn.Delete(ctx, "o1", "fs1"), store.ErrNotFound)
		// Its request_id is free again.
		if _, ok, err := sn.Create(ctx, newSnap("fs6", "o1", "req-1")); err != nil || !ok {
			t.Fatalf("request_id of a deleted snapshot: %v %v", ok, err)
		}

		creating, err := sn.ListState(ctx, store.SnapshotCreating, 0)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range creating {
			ids = append(ids, c.Org+"/"+c.ID)
		}
		if !slices.Equal(ids, []string{"o2/fs3", "o1/fs5", "o1/fs6"}) {
			t.Fatalf("CREATING = %v, want o2/fs3, o1/fs5, o1/fs6 (oldest first)", ids)
		}
	})
}

// TestSnapshotsListPages: newest first, filtered by source sandbox and state, every
// snapshot exactly once across pages, a garbage token ErrInvalid.
func TestSnapshotsListPages(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		sn := s.Snapshots()
		base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		var want []string
		for i := range 7 {
			x := newSnap(fmt.Sprintf("fs%d", i), "o1", "")
			x.CreateTime = base.Add(time.Duration(i/2) * time.Second) // pairs share a time: the id breaks the tie
			if i%3 == 0 {
				x.SourceSandboxID = "other"
			} else {
				want = append([]string{x.ID}, want...)
			}
			if _, _, err := sn.Create(ctx, x); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := sn.Create(ctx, newSnap("zz", "o2", "")); err != nil {
			t.Fatal(err)
		}
		var got []string
		token := ""
		for range 10 {
			page, next, err := sn.List(ctx, "o1", store.SnapshotFilter{SourceSandboxID: "sb1"}, store.Page{Size: 2, Token: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range page {
				got = append(got, x.ID)
			}
			if next == "" {
				break
			}
			token = next
		}
		if !slices.Equal(got, want) {
			t.Fatalf("pages = %v, want %v", got, want)
		}
		all, _, err := sn.List(ctx, "o1", store.SnapshotFilter{}, store.Page{})
		if err != nil || len(all) != 7 || all[0].ID != "fs6" || all[6].ID != "fs0" {
			t.Fatalf("all = %d, %v", len(all), err)
		}
		if _, err := sn.Complete(ctx, "o1", "fs2", store.SnapshotCompletion{State: store.SnapshotReady}); err != nil {
			t.Fatal(err)
		}
		ready, _, err := sn.List(ctx, "o1", store.SnapshotFilter{States: []string{store.SnapshotReady}}, store.Page{})
		if err != nil || len(ready) != 1 || ready[0].ID != "fs2" {
			t.Fatalf("READY = %v, %v", ready, err)
		}
		_, _, err = sn.List(ctx, "o1", store.SnapshotFilter{}, store.Page{Token: "!!not-a-token"})
		wantErr(t, err, store.ErrInvalid)
	})
}

// TestSnapshotKeys: the collector's view of which objects rows still name.
func TestSnapshotKeys(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		sn := s.Snapshots()
		for _, x := range []store.Snapshot{newSnap("a", "o1", ""), newSnap("b", "o1", ""), newSnap("c", "o2", "")} {
			if _, _, err := sn.Create(ctx, x); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := sn.SnapshotKeyExists(ctx, "fss/o1/a.tar.zst"); err != nil || !ok {
			t.Fatalf("key of a: %v %v", ok, err)
		}
		if ok, err := sn.SnapshotKeyExists(ctx, "fss/o1/zz.tar.zst"); err != nil || ok {
			t.Fatalf("key of nothing: %v %v", ok, err)
		}
		keys, err := sn.ListSnapshotKeys(ctx, "fss/o1/", "", 0)
		if err != nil || !slices.Equal(keys, []string{"fss/o1/a.tar.zst", "fss/o1/b.tar.zst"}) {
			t.Fatalf("o1 keys = %v, %v", keys, err)
		}
		keys, err = sn.ListSnapshotKeys(ctx, "", "fss/o1/a.tar.zst", 1)
		if err != nil || !slices.Equal(keys, []string{"fss/o1/b.tar.zst"}) {
			t.Fatalf("keys after a, limit 1 = %v, %v", keys, err)
		}
		keys, err = sn.ListSnapshotKeys(ctx, "", "", 0)
		if err != nil || len(keys) != 3 {
			t.Fatalf("all keys = %v, %v", keys, err)
		}
	})
}

// TestSnapshotReasonIsBoundedUTF8: a runner's message is kept to MaxSnapshotStateReasonLen
// bytes of valid UTF-8 (the API sends it as a protobuf string), cut or not.
func TestSnapshotReasonIsBoundedUTF8(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		if _, _, err := s.Snapshots().Create(ctx, newSnap("fs1", "o1", "")); err != nil {
			t.Fatal(err)
		}
		long := "bad \xff byte " + strings.Repeat("é", store.MaxSnapshotStateReasonLen)
		x, err := s.Snapshots().Complete(ctx, "o1", "fs1", store.SnapshotCompletion{State: store.SnapshotFailed, Reason: "R", StateReason: long})
		if err != nil {
			t.Fatal(err)
		}
		if len(x.StateReason) > store.MaxSnapshotStateReasonLen || !utf8.ValidString(x.StateReason) || !strings.HasPrefix(x.StateReason, "bad  byte é") {
			t.Fatalf("state reason of %d bytes, valid UTF-8 %v: %.40q", len(x.StateReason), utf8.ValidString(x.StateReason), x.StateReason)
		}
	})
}
