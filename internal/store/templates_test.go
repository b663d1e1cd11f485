package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestTemplates(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		tp := s.Templates()
		a, err := tp.Create(ctx, store.Template{ID: "t1", Org: "acme", DisplayName: "py", Spec: []byte{0x0a, 0x00},
			Attachments: []byte(`{"k":"v"}`), CreateUserID: "key1", RequestID: "r1", RequestDigest: "d1"}, 0)
		if err != nil || a.Revision != 1 || a.CreateTime.IsZero() || !a.UpdateTime.Equal(a.CreateTime) {
			t.Fatalf("create = %+v, %v", a, err)
		}
		got, err := tp.Get(ctx, "acme", "t1")
		if err != nil || string(got.Spec) != "\x0a\x00" || string(got.Attachments) != `{"k":"v"}` || got.CreateUserID != "key1" ||
			got.RequestDigest != "d1" || got.DeleteTime != nil || !got.CreateTime.Equal(a.CreateTime) {
			t.Fatalf("get = %+v, %v", got, err)
		}
		// Another organization's is not found, by ID, name or request_id.
		_, err = tp.Get(ctx, "globex", "t1")
		wantErr(t, err, store.ErrNotFound)
		_, err = tp.GetByName(ctx, "globex", "py")
		wantErr(t, err, store.ErrNotFound)
		_, err = tp.GetByRequestID(ctx, "globex", "r1")
		wantErr(t, err, store.ErrNotFound)
		if g, err := tp.GetByName(ctx, "acme", "py"); err != nil || g.ID != "t1" {
			t.Fatalf("by name = %+v, %v", g, err)
		}
		if g, err := tp.GetByRequestID(ctx, "acme", "r1"); err != nil || g.ID != "t1" {
			t.Fatalf("by request = %+v, %v", g, err)
		}
		// The name is unique per organization; another organization may use it.
		_, err = tp.Create(ctx, store.Template{ID: "t2", Org: "acme", DisplayName: "py", Spec: []byte{}}, 0)
		var dup *store.AlreadyExistsError
		if !errors.As(err, &dup) || dup.Key != store.KeyDisplayName {
			t.Fatalf("duplicate name: %v", err)
		}
		_, err = tp.Create(ctx, store.Template{ID: "t2", Org: "acme", DisplayName: "other", RequestID: "r1"}, 0)
		if !errors.As(err, &dup) || dup.Key != store.KeyRequestID {
			t.Fatalf("duplicate request_id: %v", err)
		}
		if _, err := tp.Create(ctx, store.Template{ID: "g1", Org: "globex", DisplayName: "py"}, 0); err != nil {
			t.Fatal(err)
		}
		// Update: conditional on the revision.
		name := "py2"
		u, err := tp.Update(ctx, "acme", "t1", 1, store.TemplateUpdate{DisplayName: &name, Spec: []byte{1}})
		if err != nil || u.Revision != 2 || u.DisplayName != "py2" || string(u.Spec) != "\x01" || string(u.Attachments) != `{"k":"v"}` || u.UpdateTime.Before(u.CreateTime) {
			t.Fatalf("update = %+v, %v", u, err)
		}
		_, err = tp.Update(ctx, "acme", "t1", 1, store.TemplateUpdate{DisplayName: &name})
		wantErr(t, err, store.ErrConflict)
		_, err = tp.Update(ctx, "globex", "t1", 2, store.TemplateUpdate{DisplayName: &name})
		wantErr(t, err, store.ErrNotFound)
		u, err = tp.Update(ctx, "acme", "t1", 2, store.TemplateUpdate{SetAttachments: true})
		if err != nil || u.Attachments != nil || u.Revision != 3 || u.DisplayName != "py2" {
			t.Fatalf("clear attachments = %+v, %v", u, err)
		}
		// Renaming onto a taken name.
		if _, err := tp.Create(ctx, store.Template{ID: "t3", Org: "acme", DisplayName: "taken"}, 0); err != nil {
			t.Fatal(err)
		}
		taken := "taken"
		_, err = tp.Update(ctx, "acme", "t1", 3, store.TemplateUpdate{DisplayName: &taken})
		if !errors.As(err, &dup) || dup.Key != store.KeyDisplayName {
			t.Fatalf("rename onto a taken name: %v", err)
		}
		// Soft delete frees the name; a second delete and updates are not found.
		d, err := tp.Delete(ctx, "acme", "t3")
		if err != nil || d.DeleteTime == nil {
			t.Fatalf("delete = %+v, %v", d, err)
		}
		_, err = tp.Delete(ctx, "acme", "t3")
		wantErr(t, err, store.ErrNotFound)
		_, err = tp.Update(ctx, "acme", "t3", 1, store.TemplateUpdate{DisplayName: &name})
		wantErr(t, err, store.ErrNotFound)
		_, err = tp.GetByName(ctx, "acme", "taken")
		wantErr(t, err, store.ErrNotFound)
		if g, err := tp.Get(ctx, "acme", "t3"); err != nil || g.DeleteTime == nil {
			t.Fatalf("deleted get = %+v, %v", g, err)
		}
		if _, err := tp.Create(ctx, store.Template{ID: "t4", Org: "acme", DisplayName: "taken"}, 0); err != nil {
			t.Fatalf("reuse of a deleted template's name: %v", err)
		}
		// List, with and without the deleted; pages.
		list, next, err := tp.List(ctx, "acme", false, store.Page{})
		if err != nil || len(list) != 2 || list[0].ID != "t1" || list[1].ID != "t4" || next != "" {
			t.Fatalf("list = %+v %q %v", list, next, err)
		}
		list, next, err = tp.List(ctx, "acme", true, store.Page{Size: 2})
		if err != nil || len(list) != 2 || next == "" {
			t.Fatalf("page 1 = %+v %q %v", list, next, err)
		}
		list2, next2, err := tp.List(ctx, "acme", true, store.Page{Size: 2, Token: next})
		if err != nil || len(list2) != 1 || list2[0].ID != "t4" || next2 != "" {
			t.Fatalf("page 2 = %+v %q %v", list2, next2, err)
		}
		_, _, err = tp.List(ctx, "acme", true, store.Page{Token: "garbage!"})
		wantErr(t, err, store.ErrInvalid)
		// The count limit counts templates that are not deleted.
		for i := range 3 {
			_, err = tp.Create(ctx, store.Template{ID: fmt.Sprintf("l%d", i), Org: "lim", DisplayName: fmt.Sprintf("n%d", i)}, 2)
			if i < 2 && err != nil {
				t.Fatal(err)
			}
		}
		wantErr(t, err, store.ErrLimitExceeded)
		if _, err := tp.Delete(ctx, "lim", "l0"); err != nil {
			t.Fatal(err)
		}
		if _, err := tp.Create(ctx, store.Template{ID: "l9", Org: "lim", DisplayName: "n9"}, 2); err != nil {
			t.Fatalf("after a delete: %v", err)
		}
	})
}

func TestSandboxSourceTemplate(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		if _, err := s.Sandboxes().Create(ctx, store.Sandbox{ID: "s1", Org: "acme", RunnerID: "r", State: "CREATING",
			SourceTemplateID: "t1", SourceTemplateRevision: 7}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Sandboxes().Get(ctx, "acme", "s1")
		if err != nil || got.SourceTemplateID != "t1" || got.SourceTemplateRevision != 7 {
			t.Fatalf("get = %+v, %v", got, err)
		}
		list, _, err := s.Sandboxes().List(ctx, "acme", store.SandboxFilter{}, store.Page{})
		if err != nil || len(list) != 1 || list[0].SourceTemplateID != "t1" {
			t.Fatalf("list = %+v, %v", list, err)
		}
	})
}

func TestTemplatesWithAttachment(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		tp := s.Templates()
		mk := func(id, org, att string) {
			t.Helper()
			var a []byte
			if att != "" {
				a = []byte(att)
			}
			if _, err := tp.Create(ctx, store.Template{ID: id, Org: org, DisplayName: id, Spec: []byte{}, Attachments: a}, 0); err != nil {
				t.Fatal(err)
			}
		}
		mk("w1", "acme", `{"sandboxd.warmPool":{"size":2}}`)
		mk("w2", "globex", `{"sandboxd.warmPool":{"size":1}}`)
		mk("n1", "acme", `{"other":"sandboxdXwarmPool"}`) // _ and . are no wildcards
		mk("n2", "acme", "")
		mk("w3", "acme", `{"sandboxd.warmPool":{"size":0}}`)
		if _, err := tp.Delete(ctx, "acme", "w3"); err != nil {
			t.Fatal(err)
		}
		got, err := tp.ListWithAttachment(ctx, "sandboxd.warmPool", 10)
		if err != nil || len(got) != 2 || got[0].ID != "w1" || got[1].ID != "w2" || got[1].Org != "globex" {
			t.Fatalf("ListWithAttachment = %+v, %v", got, err)
		}
		got, err = tp.ListWithAttachment(ctx, "sandboxd.warmPool", 1)
		if !errors.Is(err, store.ErrLimitExceeded) || len(got) != 1 {
			t.Fatalf("over the limit: %d, %v", len(got), err)
		}
		// Every live template of every organization, oldest first (w3 is deleted).
		got, err = tp.ListLive(ctx, 10)
		var ids []string
		for _, g := range got {
			ids = append(ids, g.Org+"/"+g.ID)
		}
		if err != nil || strings.Join(ids, ",") != "acme/w1,globex/w2,acme/n1,acme/n2" {
			t.Fatalf("ListLive = %v, %v", ids, err)
		}
		got, err = tp.ListLive(ctx, 3)
		if !errors.Is(err, store.ErrLimitExceeded) || len(got) != 3 || got[2].ID != "n1" {
			t.Fatalf("ListLive over the limit: %d, %v", len(got), err)
		}
	})
}
