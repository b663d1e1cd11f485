package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestAuditAppendListPrune(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		a := s.Audit()
		base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
		add := func(org, key, method, code string, at time.Time) store.AuditEvent {
			t.Helper()
			e, err := a.Append(ctx, store.AuditEvent{Org: org, KeyID: key, Method: method, Code: code, At: at,
				Kind: "sandbox.create", TargetType: "sandbox", TargetID: "sb-1", Source: "10.0.0.1", RequestID: "r1"})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
		add("acme", "k1", "/coreweave.sandbox.v1.SandboxService/CreateSandbox", "OK", base)
		add("acme", "k2", "/coreweave.sandbox.v1.SandboxService/DeleteSandbox", "PERMISSION_DENIED", base.Add(time.Minute))
		add("other", "k3", "/coreweave.sandbox.v1.SandboxService/CreateSandbox", "OK", base.Add(2*time.Minute))
		for i := range 5 {
			add("acme", "k1", "/sandboxd.quota.v1.QuotaService/SetQuota", "OK", base.Add(time.Hour+time.Duration(i)*time.Second))
		}

		if _, err := a.Append(ctx, store.AuditEvent{Org: "acme"}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("append without method: %v, want ErrInvalid", err)
		}
		long, err := a.Append(ctx, store.AuditEvent{Org: "acme", Method: strings.Repeat("m", 5000), Code: "OK", Message: strings.Repeat("é", 2000), At: base.Add(-time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if len(long.Method) != store.MaxAuditField || len(long.Message) > store.MaxAuditMessage {
			t.Fatalf("fields not bounded: method %d, message %d bytes", len(long.Method), len(long.Message))
		}

		list := func(f store.AuditFilter, p store.Page) ([]store.AuditEvent, string) {
			t.Helper()
			es, next, err := a.List(ctx, f, p)
			if err != nil {
				t.Fatal(err)
			}
			return es, next
		}
		all, _ := list(store.AuditFilter{Org: "acme"}, store.Page{})
		if len(all) != 8 {
			t.Fatalf("acme has %d events, want 8", len(all))
		}
		for i := 1; i < len(all); i++ {
			if all[i].At.After(all[i-1].At) {
				t.Fatalf("not newest first: %v after %v", all[i].At, all[i-1].At)
			}
		}
		if e := all[len(all)-2]; e.Org != "acme" || e.KeyID != "k1" || e.Source != "10.0.0.1" || e.RequestID != "r1" || e.TargetID != "sb-1" || !e.At.Equal(base) {
			t.Fatalf("event read back as %+v", e)
		}
		if es, _ := list(store.AuditFilter{}, store.Page{}); len(es) != 9 {
			t.Fatalf("every org: %d events, want 9", len(es))
		}
		if es, _ := list(store.AuditFilter{Org: "acme", Code: "PERMISSION_DENIED"}, store.Page{}); len(es) != 1 || es[0].KeyID != "k2" {
			t.Fatalf("by code: %+v", es)
		}
		if es, _ := list(store.AuditFilter{Org: "acme", KeyID: "k1", Method: "CreateSandbox"}, store.Page{}); len(es) != 1 {
			t.Fatalf("by key and method suffix: %+v", es)
		}
		if es, _ := list(store.AuditFilter{Method: "/coreweave.sandbox.v1.SandboxService/CreateSandbox"}, store.Page{}); len(es) != 2 {
			t.Fatalf("by exact method: %d events, want 2", len(es))
		}
		if es, _ := list(store.AuditFilter{Org: "acme", Since: base, Until: base.Add(time.Hour)}, store.Page{}); len(es) != 2 {
			t.Fatalf("by time: %d events, want 2", len(es))
		}
		// Pages of 3 walk every event once.
		seen := map[string]bool{}
		tok := ""
		for pages := 0; ; pages++ {
			es, next := list(store.AuditFilter{Org: "acme"}, store.Page{Size: 3, Token: tok})
			for _, e := range es {
				if seen[e.ID] {
					t.Fatalf("event %s twice", e.ID)
				}
				seen[e.ID] = true
			}
			if next == "" {
				break
			}
			tok = next
			if pages > 5 {
				t.Fatal("pagination does not end")
			}
		}
		if len(seen) != 8 {
			t.Fatalf("pages held %d events, want 8", len(seen))
		}
		if _, _, err := a.List(ctx, store.AuditFilter{}, store.Page{Token: "!!"}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("bad token: %v, want ErrInvalid", err)
		}

		n, err := a.DeleteBefore(ctx, base.Add(30*time.Minute))
		if err != nil || n != 4 {
			t.Fatalf("prune: %d, %v; want 4", n, err)
		}
		if es, _ := list(store.AuditFilter{}, store.Page{}); len(es) != 5 {
			t.Fatalf("after prune: %d events, want 5", len(es))
		}
	})
}

// TestAuditActorOrg: an event a platform admin made on another organization's objects is
// that organization's (its listing finds it, with the actor's organization) and the
// actor's organization's listing finds it too; nobody else's does.
func TestAuditActorOrg(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		a := s.Audit()
		if _, err := a.Append(ctx, store.AuditEvent{Org: "acme", ActorOrg: "platform", KeyID: "kp", Method: "/sandboxd.quota.v1.QuotaService/SetQuota", Code: "OK", At: time.Unix(1000, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Append(ctx, store.AuditEvent{Org: "platform", ActorOrg: "platform", KeyID: "kp", Method: "/x.Y/Z", Code: "OK", At: time.Unix(1001, 0)}); err != nil {
			t.Fatal(err)
		}
		list := func(org string) []store.AuditEvent {
			t.Helper()
			es, _, err := a.List(ctx, store.AuditFilter{Org: org}, store.Page{})
			if err != nil {
				t.Fatal(err)
			}
			return es
		}
		if es := list("acme"); len(es) != 1 || es[0].Org != "acme" || es[0].ActorOrg != "platform" || es[0].KeyID != "kp" {
			t.Fatalf("acme's events: %+v", es)
		}
		if es := list("platform"); len(es) != 2 || es[1].Org != "acme" || es[0].ActorOrg != "" {
			t.Fatalf("the platform's events: %+v", es)
		}
		if es := list("other"); len(es) != 0 {
			t.Fatalf("another organization's events: %+v", es)
		}
	})
}
