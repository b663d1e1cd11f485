package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestVolumes(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		vs := s.Volumes()
		v := store.Volume{Org: "acme", ID: "data", RunnerID: "r1", Namespace: "default", ClaimName: "c1", SubPath: "a/b",
			ReadOnly: true, Description: "d", State: "VALIDATING", RequestID: "q1", RequestDigest: "dg", SizeBytes: 1 << 30}
		a, err := vs.Create(ctx, v, 0, nil)
		if err != nil || a.CreateTime.IsZero() {
			t.Fatalf("create = %+v, %v", a, err)
		}
		got, err := vs.Get(ctx, "acme", "data")
		if err != nil || got.ClaimName != "c1" || got.SubPath != "a/b" || !got.ReadOnly || got.Description != "d" ||
			got.State != "VALIDATING" || got.RequestDigest != "dg" || got.LastValidated != nil {
			t.Fatalf("get = %+v, %v", got, err)
		}
		// Another organization sees nothing, and may use the same id and claim.
		_, err = vs.Get(ctx, "globex", "data")
		wantErr(t, err, store.ErrNotFound)
		_, err = vs.GetByRequestID(ctx, "globex", "q1")
		wantErr(t, err, store.ErrNotFound)
		if g, err := vs.GetByRequestID(ctx, "acme", "q1"); err != nil || g.ID != "data" {
			t.Fatalf("by request = %+v, %v", g, err)
		}
		if _, err := vs.Create(ctx, store.Volume{Org: "globex", ID: "data", RunnerID: "r1", Namespace: "default", ClaimName: "c1", State: "READY", SizeBytes: 1 << 30}, 0, nil); err != nil {
			t.Fatal(err)
		}
		var dup *store.AlreadyExistsError
		_, err = vs.Create(ctx, store.Volume{Org: "acme", ID: "data", RunnerID: "r1", Namespace: "default", ClaimName: "c2", State: "READY", SizeBytes: 1 << 30}, 0, nil)
		if !errors.As(err, &dup) || dup.Key != store.KeyID {
			t.Fatalf("duplicate id: %v", err)
		}
		_, err = vs.Create(ctx, store.Volume{Org: "acme", ID: "other", RunnerID: "r1", Namespace: "default", ClaimName: "c1", State: "READY", SizeBytes: 1 << 30}, 0, nil)
		if !errors.As(err, &dup) || dup.Key != store.KeyClaimName {
			t.Fatalf("duplicate claim: %v", err)
		}
		_, err = vs.Create(ctx, store.Volume{Org: "acme", ID: "other", RunnerID: "r1", Namespace: "default", ClaimName: "c3", State: "READY", RequestID: "q1", SizeBytes: 1 << 30}, 0, nil)
		if !errors.As(err, &dup) || dup.Key != store.KeyRequestID {
			t.Fatalf("duplicate request: %v", err)
		}
		_, err = vs.Create(ctx, store.Volume{Org: "acme", ID: "other", RunnerID: "r1", Namespace: "default", ClaimName: "c3", State: "READY", SizeBytes: 1 << 30}, 1, nil)
		wantErr(t, err, store.ErrLimitExceeded)
		// Update: state with its reason, capacity, validation time, description.
		st, reason, capb, now := "ERROR", "broken", int64(10<<30), time.Now()
		u, err := vs.Update(ctx, "acme", "data", store.VolumeUpdate{State: &st, StateReason: &reason, CapacityBytes: &capb, LastValidated: &now})
		if err != nil || u.State != "ERROR" || u.StateReason != "broken" || u.CapacityBytes != capb || u.LastValidated == nil || u.Description != "d" {
			t.Fatalf("update = %+v, %v", u, err)
		}
		st, desc := "READY", "new"
		u, err = vs.Update(ctx, "acme", "data", store.VolumeUpdate{State: &st, Description: &desc})
		if err != nil || u.State != "READY" || u.StateReason != "" || u.Description != "new" || u.CapacityBytes != capb {
			t.Fatalf("update = %+v, %v", u, err)
		}
		if u.AccessModes != nil {
			t.Fatalf("access modes before any are reported: %q", u.AccessModes)
		}
		// Access modes: set, kept by other updates, cleared by an empty list.
		modes := []string{"ReadWriteOnce", "ReadOnlyMany"}
		if u, err = vs.Update(ctx, "acme", "data", store.VolumeUpdate{AccessModes: &modes}); err != nil || strings.Join(u.AccessModes, ",") != "ReadWriteOnce,ReadOnlyMany" {
			t.Fatalf("access modes = %q, %v", u.AccessModes, err)
		}
		if u, err = vs.Get(ctx, "acme", "data"); err != nil || strings.Join(u.AccessModes, ",") != "ReadWriteOnce,ReadOnlyMany" {
			t.Fatalf("get: access modes = %q, %v", u.AccessModes, err)
		}
		if u, err = vs.Update(ctx, "acme", "data", store.VolumeUpdate{Description: &desc}); err != nil || len(u.AccessModes) != 2 {
			t.Fatalf("access modes lost by another update: %q, %v", u.AccessModes, err)
		}
		none := []string{}
		if u, err = vs.Update(ctx, "acme", "data", store.VolumeUpdate{AccessModes: &none}); err != nil || u.AccessModes != nil {
			t.Fatalf("cleared access modes = %q, %v", u.AccessModes, err)
		}
		_, err = vs.Update(ctx, "globex", "nope", store.VolumeUpdate{Description: &desc})
		wantErr(t, err, store.ErrNotFound)
		// List: filters and pages.
		for i := range 3 {
			if _, err := vs.Create(ctx, store.Volume{Org: "acme", ID: fmt.Sprintf("v%d", i), RunnerID: "r2", Namespace: "default",
				ClaimName: fmt.Sprintf("k%d", i), State: "VALIDATING", SizeBytes: 1 << 30}, 0, nil); err != nil {
				t.Fatal(err)
			}
		}
		var ids []string
		tok := ""
		for {
			page, next, err := vs.List(ctx, "acme", store.VolumeFilter{}, store.Page{Size: 2, Token: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range page {
				ids = append(ids, p.ID)
			}
			if next == "" {
				break
			}
			tok = next
		}
		if fmt.Sprint(ids) != "[data v0 v1 v2]" {
			t.Fatalf("list = %v", ids)
		}
		page, _, err := vs.List(ctx, "acme", store.VolumeFilter{States: []string{"READY"}}, store.Page{})
		if err != nil || len(page) != 1 || page[0].ID != "data" {
			t.Fatalf("by state = %+v, %v", page, err)
		}
		page, _, err = vs.List(ctx, "acme", store.VolumeFilter{RunnerIDs: []string{"r2"}}, store.Page{})
		if err != nil || len(page) != 3 {
			t.Fatalf("by runner = %+v, %v", page, err)
		}
		// Attachments follow the sandbox index: live sandboxes only, of the organization.
		sb := s.Sandboxes()
		for _, id := range []string{"s1", "s2"} {
			if _, err := sb.Create(ctx, store.Sandbox{ID: id, Org: "acme", RunnerID: "r1", State: "RUNNING", VolumeIDs: []string{"data", "data", "v0"}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := sb.Create(ctx, store.Sandbox{ID: "s3", Org: "acme", RunnerID: "r1", State: "RUNNING"}); err != nil {
			t.Fatal(err)
		}
		ended := time.Now()
		if _, err := sb.UpdateStatus(ctx, "acme", "s2", store.SandboxStatusUpdate{State: "COMPLETED", EndedAt: &ended}); err != nil {
			t.Fatal(err)
		}
		att, n, err := vs.Attached(ctx, "acme", "data", 10)
		if err != nil || n != 1 || fmt.Sprint(att) != "[s1]" {
			t.Fatalf("attached = %v %d %v", att, n, err)
		}
		if _, n, err := vs.Attached(ctx, "globex", "data", 10); err != nil || n != 0 {
			t.Fatalf("other org attached = %d %v", n, err)
		}
		list, _, err := sb.List(ctx, "acme", store.SandboxFilter{VolumeIDs: []string{"v0", "zzz"}, IncludeTerminal: true}, store.Page{})
		if err != nil || len(list) != 2 {
			t.Fatalf("by volume = %+v, %v", list, err)
		}
		// Delete returns it; then it is gone and its id free.
		d, err := vs.Delete(ctx, "acme", "data")
		if err != nil || d.ID != "data" {
			t.Fatalf("delete = %+v, %v", d, err)
		}
		_, err = vs.Delete(ctx, "acme", "data")
		wantErr(t, err, store.ErrNotFound)
		if g, err := vs.Get(ctx, "globex", "data"); err != nil || g.Org != "globex" {
			t.Fatalf("other org's = %+v, %v", g, err)
		}
	})
}

func TestVolumeLeases(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		vs := s.Volumes()
		never := func(string, time.Time) bool { return false }
		if h, err := vs.AcquireLease(ctx, "acme", "g", "create:1", never); err != nil || h != "" {
			t.Fatalf("first acquire = %q, %v", h, err)
		}
		// Held: another asker gets the holder; the holder itself gets it again.
		if h, err := vs.AcquireLease(ctx, "acme", "g", "create:2", never); err != nil || h != "create:1" {
			t.Fatalf("second acquire = %q, %v", h, err)
		}
		if h, err := vs.AcquireLease(ctx, "acme", "g", "create:1", never); err != nil || h != "" {
			t.Fatalf("re-acquire = %q, %v", h, err)
		}
		// Another organization's volume of the same ID is another lease.
		if h, err := vs.AcquireLease(ctx, "globex", "g", "x", never); err != nil || h != "" {
			t.Fatalf("other org = %q, %v", h, err)
		}
		if err := vs.MoveLease(ctx, "acme", "g", "create:1", "sb-1"); err != nil {
			t.Fatal(err)
		}
		if err := vs.MoveLease(ctx, "acme", "g", "create:1", "sb-2"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("move from a non-holder = %v", err)
		}
		if h, since, err := vs.LeaseHolder(ctx, "acme", "g"); err != nil || h != "sb-1" || since.IsZero() {
			t.Fatalf("holder = %q %v %v", h, since, err)
		}
		// A stale holder is taken over; the check sees who and since when.
		var asked string
		h, err := vs.AcquireLease(ctx, "acme", "g", "create:3", func(h string, since time.Time) bool { asked = h; return !since.IsZero() })
		if err != nil || h != "" || asked != "sb-1" {
			t.Fatalf("take over = %q, %v (asked %q)", h, err, asked)
		}
		// Releasing by a non-holder does nothing; by the holder frees it.
		if err := vs.ReleaseLease(ctx, "acme", "g", "sb-1"); err != nil {
			t.Fatal(err)
		}
		if h, _, _ := vs.LeaseHolder(ctx, "acme", "g"); h != "create:3" {
			t.Fatalf("holder after a stranger's release = %q", h)
		}
		if err := vs.ReleaseLease(ctx, "acme", "g", "create:3"); err != nil {
			t.Fatal(err)
		}
		if h, _, err := vs.LeaseHolder(ctx, "acme", "g"); err != nil || h != "" {
			t.Fatalf("holder after release = %q, %v", h, err)
		}
	})
}

// TestVolumeUpdateIfSize: VolumeUpdate.IfSizeBytes makes an update a compare-and-set on
// the size (both backends): applied while the size is the one given, else ErrConflict
// and nothing changed; a missing volume is still ErrNotFound.
func TestVolumeUpdateIfSize(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		vs := s.Volumes()
		if _, err := vs.Create(ctx, store.Volume{Org: "acme", ID: "data", RunnerID: "r1", Namespace: "default", ClaimName: "c1", State: "READY", SizeBytes: 1 << 30}, 0, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := vs.Resize(ctx, "acme", "data", 3<<30, nil); err != nil {
			t.Fatal(err)
		}
		// A stale undo (it set 2Gi; another grow made it 3Gi since): refused.
		old, stale := int64(1<<30), int64(2<<30)
		_, err := vs.Update(ctx, "acme", "data", store.VolumeUpdate{SizeBytes: &old, IfSizeBytes: &stale})
		wantErr(t, err, store.ErrConflict)
		if g, _ := vs.Get(ctx, "acme", "data"); g.SizeBytes != 3<<30 {
			t.Fatalf("size after a refused compare-and-set = %d", g.SizeBytes)
		}
		cur := int64(3 << 30)
		if g, err := vs.Update(ctx, "acme", "data", store.VolumeUpdate{SizeBytes: &old, IfSizeBytes: &cur}); err != nil || g.SizeBytes != 1<<30 {
			t.Fatalf("compare-and-set = %+v, %v", g, err)
		}
		_, err = vs.Update(ctx, "acme", "nope", store.VolumeUpdate{SizeBytes: &old, IfSizeBytes: &cur})
		wantErr(t, err, store.ErrNotFound)
	})
}
