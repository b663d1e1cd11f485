package store_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func mustOrg(t *testing.T, s store.Store, id string) {
	t.Helper()
	if _, err := s.Orgs().Create(t.Context(), store.Org{ID: id, Name: "Org " + id}); err != nil {
		t.Fatalf("create org %s: %v", id, err)
	}
}

func mustRunner(t *testing.T, s store.Store, org, id, cluster string) store.Runner {
	t.Helper()
	r, err := s.Runners().Create(t.Context(), store.Runner{Org: org, RunnerID: id, ClusterID: cluster, Zone: "us-east-1a",
		Policy: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatalf("create runner %s: %v", id, err)
	}
	return r
}

func ptr[T any](v T) *T { return &v }

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want %v", err, target)
	}
}

func wantKey(t *testing.T, err error, key string) {
	t.Helper()
	var ae *store.AlreadyExistsError
	if !errors.Is(err, store.ErrAlreadyExists) || !errors.As(err, &ae) || ae.Key != key {
		t.Fatalf("err = %v, want AlreadyExists on %s", err, key)
	}
}

func wantUTC(t *testing.T, ts ...time.Time) {
	t.Helper()
	for _, x := range ts {
		if x.IsZero() || x.Location() != time.UTC {
			t.Fatalf("time %v: want non-zero UTC", x)
		}
	}
}

func TestOpenDSN(t *testing.T) {
	dir := t.TempDir()
	for _, dsn := range []string{"sqlite://" + filepath.Join(dir, "a.db"), filepath.Join(dir, "sub", "b.db")} {
		s, err := store.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("open %s: %v", dsn, err)
		}
		if s.Backend() != "sqlite" {
			t.Fatalf("%s: backend %s", dsn, s.Backend())
		}
		s.Close()
	}
	// The SQLite file is in WAL mode with foreign keys enforced.
	db, err := sql.Open("sqlite", filepath.Join(dir, "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := db.QueryRowContext(t.Context(), "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v", mode, err)
	}
	db.Close()
	_, err = store.Open(t.Context(), "mysql://x")
	wantErr(t, err, store.ErrInvalid)
	if pgAdminDSN != "" {
		s := openStore(t, newPostgresSchema(t))
		if s.Backend() != "postgres" {
			t.Fatalf("backend %s", s.Backend())
		}
	}
}

func TestMigrations(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		s, err := store.Open(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		mustOrg(t, s, "o1")
		s.Close()

		// Reopening applies nothing and keeps the data.
		s = openStore(t, dsn)
		if _, err := s.Orgs().Get(t.Context(), "o1"); err != nil {
			t.Fatalf("after reopen: %v", err)
		}
		s.Close()

		// A database migrated by a newer binary is refused.
		rawExec(t, dsn, fmt.Sprintf(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'future', %s)`,
			store.SchemaVersion()+1, map[bool]string{true: "now()", false: "0"}[strings.HasPrefix(dsn, "postgres://")]))
		_, err = store.Open(t.Context(), dsn)
		wantErr(t, err, store.ErrSchemaTooNew)
	})
}

func TestMigrationsConcurrentOpen(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				s, err := store.Open(t.Context(), dsn)
				if err == nil {
					s.Close()
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestOrgs(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		o, err := s.Orgs().Create(ctx, store.Org{ID: "b", Name: "Bee"})
		if err != nil {
			t.Fatal(err)
		}
		wantUTC(t, o.CreatedAt)
		mustOrg(t, s, "a")
		_, err = s.Orgs().Create(ctx, store.Org{ID: "a"})
		wantKey(t, err, store.KeyID)
		_, err = s.Orgs().Create(ctx, store.Org{})
		wantErr(t, err, store.ErrInvalid)
		got, err := s.Orgs().Get(ctx, "b")
		if err != nil || got != o {
			t.Fatalf("get = %+v, %v; want %+v", got, err, o)
		}
		_, err = s.Orgs().Get(ctx, "zzz")
		wantErr(t, err, store.ErrNotFound)
		list, err := s.Orgs().List(ctx)
		if err != nil || len(list) != 2 || list[0].ID != "a" || list[1].ID != "b" {
			t.Fatalf("list = %+v, %v", list, err)
		}
	})
}

func TestAPIKeys(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o1")
		mustOrg(t, s, "o2")
		keys := s.APIKeys()
		k, err := keys.Create(ctx, store.APIKey{ID: "k1", Org: "o1", Role: store.RoleAdmin, Name: "ci", Hash: "ab12"})
		if err != nil {
			t.Fatal(err)
		}
		wantUTC(t, k.CreatedAt)
		if _, err := keys.Create(ctx, store.APIKey{ID: "k2", Org: "o1", Role: store.RoleUser, Hash: "cd34"}); err != nil {
			t.Fatal(err)
		}
		if _, err := keys.Create(ctx, store.APIKey{ID: "k3", Org: "o2", Role: store.RoleUser, Hash: "ef56"}); err != nil {
			t.Fatal(err)
		}
		_, err = keys.Create(ctx, store.APIKey{ID: "k1", Org: "o1", Role: store.RoleUser, Hash: "x"})
		wantKey(t, err, store.KeyID)
		_, err = keys.Create(ctx, store.APIKey{ID: "k9", Org: "o1", Role: "ROOT", Hash: "x"})
		wantErr(t, err, store.ErrInvalid)
		_, err = keys.Create(ctx, store.APIKey{ID: "k9", Org: "nope", Role: store.RoleUser, Hash: "x"})
		wantErr(t, err, store.ErrNotFound)

		got, err := keys.Get(ctx, "k1")
		if err != nil || got.Hash != "ab12" || got.Org != "o1" || got.Role != store.RoleAdmin || got.Name != "ci" ||
			!got.CreatedAt.Equal(k.CreatedAt) || got.RevokedAt != nil || got.LastUsedAt != nil {
			t.Fatalf("get = %+v, %v", got, err)
		}
		list, err := keys.List(ctx, "o1")
		if err != nil || len(list) != 2 || list[0].ID != "k1" || list[1].ID != "k2" {
			t.Fatalf("list = %+v, %v", list, err)
		}

		// Touch: recorded, never moves backwards; unknown key is NotFound.
		t1 := time.Now().Add(-time.Minute)
		if err := keys.TouchLastUsed(ctx, "k1", t1); err != nil {
			t.Fatal(err)
		}
		if err := keys.TouchLastUsed(ctx, "k1", t1.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		got, _ = keys.Get(ctx, "k1")
		if got.LastUsedAt == nil || !got.LastUsedAt.Equal(t1.Truncate(time.Microsecond)) {
			t.Fatalf("last used = %v, want %v", got.LastUsedAt, t1)
		}
		wantUTC(t, *got.LastUsedAt)
		wantErr(t, keys.TouchLastUsed(ctx, "nope", t1), store.ErrNotFound)

		// Revoke is organization-scoped, soft, and keeps the first time.
		_, err = keys.Revoke(ctx, "o2", "k1")
		wantErr(t, err, store.ErrNotFound)
		r1, err := keys.Revoke(ctx, "o1", "k1")
		if err != nil || r1.RevokedAt == nil {
			t.Fatalf("revoke = %+v, %v", r1, err)
		}
		r2, err := keys.Revoke(ctx, "o1", "k1")
		if err != nil || !r2.RevokedAt.Equal(*r1.RevokedAt) {
			t.Fatalf("second revoke = %+v, %v", r2, err)
		}
		got, err = keys.Get(ctx, "k1")
		if err != nil || got.RevokedAt == nil {
			t.Fatalf("revoked key = %+v, %v", got, err)
		}
	})
}

func TestRunnersCRUD(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		rs := s.Runners()
		mustOrg(t, s, "o1")
		mustOrg(t, s, "o2")

		r, err := rs.Create(ctx, store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c1", Zone: "z", DisplayName: "One"})
		if err != nil {
			t.Fatal(err)
		}
		if r.RunnerGroupID != store.DefaultRunnerGroup || r.ReleaseChannel != store.ChannelStable ||
			r.Policy != nil || r.PolicyRevision != 0 || r.Etag == "" || r.Status.LastHeartbeatAt != nil {
			t.Fatalf("defaults: %+v", r)
		}
		wantUTC(t, r.CreatedAt, r.UpdatedAt)
		got, err := rs.Get(ctx, "o1", "r1")
		if err != nil || got.Etag != r.Etag || got.ClusterID != "c1" || got.Zone != "z" || got.DisplayName != "One" {
			t.Fatalf("get = %+v, %v", got, err)
		}
		_, err = rs.Get(ctx, "o2", "r1")
		wantErr(t, err, store.ErrNotFound)

		// Uniqueness within an organization.
		_, err = rs.Create(ctx, store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c9"})
		wantKey(t, err, store.KeyRunnerID)
		_, err = rs.Create(ctx, store.Runner{Org: "o1", RunnerID: "r2", ClusterID: "c1"})
		wantKey(t, err, store.KeyClusterID)
		// A runner_id is taken across organizations (it names endpoint hosts and
		// certificates); a cluster_id is per organization.
		_, err = rs.Create(ctx, store.Runner{Org: "o2", RunnerID: "r1", ClusterID: "c1", Policy: json.RawMessage(`{}`)})
		wantKey(t, err, store.KeyRunnerID)
		if _, err := rs.Create(ctx, store.Runner{Org: "o2", RunnerID: "r2", ClusterID: "c1", Policy: json.RawMessage(`{}`)}); err != nil {
			t.Fatalf("same cluster_id in another org: %v", err)
		}
		_, err = rs.Create(ctx, store.Runner{Org: "nope", RunnerID: "r3", ClusterID: "c1"})
		wantErr(t, err, store.ErrNotFound)

		for name, bad := range map[string]store.Runner{
			"channel":     {Org: "o1", RunnerID: "x", ClusterID: "x", ReleaseChannel: "BETA"},
			"policy null": {Org: "o1", RunnerID: "x", ClusterID: "x", Policy: json.RawMessage(`null`)},
			"policy junk": {Org: "o1", RunnerID: "x", ClusterID: "x", Policy: json.RawMessage(`{`)},
			"no cluster":  {Org: "o1", RunnerID: "x"},
		} {
			if _, err := rs.Create(ctx, bad); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", name, err)
			}
		}

		// Updates: each write changes the etag; only policy writes bump policy_revision.
		u1, err := rs.Update(ctx, "o1", "r1", r.Etag, store.RunnerUpdate{DisplayName: ptr("Uno"), RunnerGroupID: ptr("gpu")})
		if err != nil {
			t.Fatal(err)
		}
		if u1.Etag == r.Etag || u1.DisplayName != "Uno" || u1.RunnerGroupID != "gpu" || u1.PolicyRevision != 0 || u1.Policy != nil {
			t.Fatalf("update 1: %+v", u1)
		}
		policy := json.RawMessage(`{"constraints": {"lifetime": {"max": "3600s"}}}`)
		u2, err := rs.Update(ctx, "o1", "r1", u1.Etag, store.RunnerUpdate{Policy: policy, ReleaseChannel: ptr(store.ChannelRapid)})
		if err != nil {
			t.Fatal(err)
		}
		if string(u2.Policy) != string(policy) || u2.PolicyRevision != 1 || u2.DisplayName != "Uno" || u2.ReleaseChannel != store.ChannelRapid {
			t.Fatalf("update 2: %+v", u2)
		}
		u3, err := rs.Update(ctx, "o1", "r1", u2.Etag, store.RunnerUpdate{Policy: json.RawMessage(`{}`)})
		if err != nil || string(u3.Policy) != `{}` || u3.PolicyRevision != 2 {
			t.Fatalf("update 3: %+v, %v", u3, err)
		}
		_, err = rs.Update(ctx, "o1", "r1", u2.Etag, store.RunnerUpdate{DisplayName: ptr("stale")})
		wantErr(t, err, store.ErrConflict)
		_, err = rs.Update(ctx, "o1", "r1", "garbage", store.RunnerUpdate{DisplayName: ptr("x")})
		wantErr(t, err, store.ErrConflict)
		_, err = rs.Update(ctx, "o1", "missing", u3.Etag, store.RunnerUpdate{DisplayName: ptr("x")})
		wantErr(t, err, store.ErrNotFound)
		_, err = rs.Update(ctx, "o1", "r1", u3.Etag, store.RunnerUpdate{Policy: json.RawMessage(`null`)})
		wantErr(t, err, store.ErrInvalid)
		_, err = rs.Update(ctx, "o1", "r1", u3.Etag, store.RunnerUpdate{ReleaseChannel: ptr("NIGHTLY")})
		wantErr(t, err, store.ErrInvalid)
		_, err = rs.Update(ctx, "o1", "r1", u3.Etag, store.RunnerUpdate{DesiredVersion: ptr("1.2.3")})
		if err != nil {
			t.Fatal(err)
		}
		cur, _ := rs.Get(ctx, "o1", "r1")
		if cur.DesiredVersion != "1.2.3" || string(cur.Policy) != `{}` {
			t.Fatalf("after desired version: %+v", cur)
		}

		// Delete: stale etag conflicts; a re-created runner does not accept old etags.
		wantErr(t, rs.Delete(ctx, "o1", "r1", u3.Etag), store.ErrConflict)
		if err := rs.Delete(ctx, "o1", "r1", cur.Etag); err != nil {
			t.Fatal(err)
		}
		_, err = rs.Get(ctx, "o1", "r1")
		wantErr(t, err, store.ErrNotFound)
		wantErr(t, rs.Delete(ctx, "o1", "r1", ""), store.ErrNotFound)
		again := mustRunner(t, s, "o1", "r1", "c1")
		if again.Etag == r.Etag {
			t.Fatalf("re-created runner reuses etag %s", r.Etag)
		}
		_, err = rs.Update(ctx, "o1", "r1", r.Etag, store.RunnerUpdate{DisplayName: ptr("x")})
		wantErr(t, err, store.ErrConflict)
		if err := rs.Delete(ctx, "o1", "r1", ""); err != nil {
			t.Fatal(err)
		}
		// A deleted runner's ID stays its organization's (certificates naming it outlive
		// the runner: TestRunnerIDHold): another organization is refused it, its own may
		// create it again.
		_, err = rs.Create(ctx, store.Runner{Org: "o2", RunnerID: "r1", ClusterID: "c7"})
		wantKey(t, err, store.KeyRunnerID)
		if _, err := rs.Create(ctx, store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c7"}); err != nil {
			t.Fatalf("o1 creates its deleted r1 again: %v", err)
		}
	})
}

// TestRunnerIDAcrossOrgs: of concurrent creates of one runner_id by several
// organizations exactly one wins (the check and the insert are one serialized
// transaction); IDHolder names the earliest holder when older data has duplicates.
func TestRunnerIDAcrossOrgs(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn)
		ctx := t.Context()
		const n = 6
		for i := range n {
			mustOrg(t, s, fmt.Sprintf("o%d", i))
		}
		for round := range 3 {
			id := fmt.Sprintf("race%d", round)
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					_, errs[i] = s.Runners().Create(ctx, store.Runner{Org: fmt.Sprintf("o%d", i), RunnerID: id, ClusterID: id})
				})
			}
			wg.Wait()
			won, winner := 0, ""
			for i, err := range errs {
				switch {
				case err == nil:
					won, winner = won+1, fmt.Sprintf("o%d", i)
				default:
					wantKey(t, err, store.KeyRunnerID)
				}
			}
			if won != 1 {
				t.Fatalf("%s: %d creates won, want 1 (%v)", id, won, errs)
			}
			if org, err := s.Runners().IDHolder(ctx, id); err != nil || org != winner {
				t.Fatalf("IDHolder(%s) = %q, %v; want %q", id, org, err, winner)
			}
		}
		_, err := s.Runners().IDHolder(ctx, "nobody")
		wantErr(t, err, store.ErrNotFound)

		// A duplicate from before the check (forced here): the earlier runner holds the ID.
		mustRunner(t, s, "o1", "dup", "cd")
		mustRunner(t, s, "o2", "dup-later", "cd")
		rawExec(t, dsn, `UPDATE runners SET runner_id = 'dup' WHERE org_id = 'o2' AND runner_id = 'dup-later'`)
		if org, err := s.Runners().IDHolder(ctx, "dup"); err != nil || org != "o1" {
			t.Fatalf("IDHolder(dup) = %q, %v; want o1 (created first)", org, err)
		}
	})
}

// TestRunnerIDHold: a deleted runner's ID is held for its organization for
// store.RunnerIDHold (certificates naming the ID outlive the runner): another
// organization's create is refused until the hold has passed, then succeeds; a second
// delete renews the hold.
func TestRunnerIDHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn)
		ctx := t.Context()
		mustOrg(t, s, "o1")
		mustOrg(t, s, "o2")
		mustRunner(t, s, "o1", "held", "c1")
		if err := s.Runners().Delete(ctx, "o1", "held", ""); err != nil {
			t.Fatal(err)
		}
		_, err := s.Runners().Create(ctx, store.Runner{Org: "o2", RunnerID: "held", ClusterID: "c2"})
		wantKey(t, err, store.KeyRunnerID)
		if _, err := s.Runners().IDHolder(ctx, "held"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("IDHolder of a deleted runner's ID: %v, want not found (no certificate for it)", err)
		}
		// The hold passes (forced here): the ID is free.
		rawExec(t, dsn, `DELETE FROM runner_id_holds WHERE runner_id = 'held'`)
		if _, err := s.Runners().Create(ctx, store.Runner{Org: "o2", RunnerID: "held", ClusterID: "c2"}); err != nil {
			t.Fatalf("o2 takes the ID once its hold passed: %v", err)
		}
		if err := s.Runners().Delete(ctx, "o2", "held", ""); err != nil {
			t.Fatal(err)
		}
		_, err = s.Runners().Create(ctx, store.Runner{Org: "o1", RunnerID: "held", ClusterID: "c1"})
		wantKey(t, err, store.KeyRunnerID) // now o2's hold
	})
}

func TestRunnerConcurrentUpdatesOneWins(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		mustOrg(t, s, "o1")
		r := mustRunner(t, s, "o1", "r1", "c1")
		const n = 8
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = s.Runners().Update(t.Context(), "o1", "r1", r.Etag,
					store.RunnerUpdate{Policy: json.RawMessage(fmt.Sprintf(`{"writer": %d}`, i))})
			})
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrConflict):
				t.Fatalf("unexpected error: %v", err)
			}
		}
		got, _ := s.Runners().Get(t.Context(), "o1", "r1")
		if won != 1 || got.PolicyRevision != 2 {
			t.Fatalf("%d writers won, policy revision %d; want 1 and 2", won, got.PolicyRevision)
		}
	})
}

func TestRunnerHeartbeatKeepsEtag(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o1")
		r := mustRunner(t, s, "o1", "r1", "c1")
		at := time.Now().Add(-time.Second)
		hb := store.RunnerStatus{LastHeartbeatAt: &at, Version: "0.3.1", Ready: true,
			Capacity: json.RawMessage(`{"cpu":"8","memory":"32Gi"}`), Usage: json.RawMessage(`{"sandboxes":3}`)}
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", hb); err != nil {
			t.Fatal(err)
		}
		got, err := s.Runners().Get(ctx, "o1", "r1")
		if err != nil {
			t.Fatal(err)
		}
		if got.Etag != r.Etag || !got.UpdatedAt.Equal(r.UpdatedAt) || got.PolicyRevision != r.PolicyRevision {
			t.Fatalf("heartbeat changed admin fields: %+v vs %+v", got, r)
		}
		st := got.Status
		if st.LastHeartbeatAt == nil || !st.LastHeartbeatAt.Equal(at.Truncate(time.Microsecond)) || st.Version != "0.3.1" ||
			!st.Ready || string(st.Capacity) != string(hb.Capacity) || string(st.Usage) != string(hb.Usage) {
			t.Fatalf("status = %+v", st)
		}
		wantUTC(t, *st.LastHeartbeatAt)
		// The etag read before the heartbeat still works.
		if _, err := s.Runners().Update(ctx, "o1", "r1", r.Etag, store.RunnerUpdate{DisplayName: ptr("x")}); err != nil {
			t.Fatalf("update after heartbeat: %v", err)
		}
		wantErr(t, s.Runners().RecordHeartbeat(ctx, "o2", "r1", hb), store.ErrNotFound)
		wantErr(t, s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{Capacity: json.RawMessage(`{`)}), store.ErrInvalid)
	})
}

func TestRunnersListPagination(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		mustOrg(t, s, "o1")
		mustOrg(t, s, "o2")
		var want []string
		for i := range 25 {
			id := fmt.Sprintf("r%02d", 24-i) // created out of order
			mustRunner(t, s, "o1", id, "c"+id)
			want = append(want, id)
		}
		mustRunner(t, s, "o2", "other", "c")
		slices.Sort(want)
		var got []string
		tok, pages := "", 0
		for {
			page, next, err := s.Runners().List(t.Context(), "o1", store.Page{Size: 10, Token: tok})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, r := range page {
				got = append(got, r.RunnerID)
			}
			if next == "" {
				break
			}
			tok = next
		}
		if pages != 3 || !slices.Equal(got, want) {
			t.Fatalf("%d pages: %v", pages, got)
		}
		_, _, err := s.Runners().List(t.Context(), "o1", store.Page{Token: "!!"})
		wantErr(t, err, store.ErrInvalid)
	})
}

func TestBootstrapTokens(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o1")
		mustRunner(t, s, "o1", "r1", "c1")
		bt := s.BootstrapTokens()
		future := time.Now().Add(time.Hour)
		if err := bt.Create(ctx, store.BootstrapToken{Hash: "h1", Org: "o1", RunnerID: "r1", ExpiresAt: future}); err != nil {
			t.Fatal(err)
		}
		wantKey(t, bt.Create(ctx, store.BootstrapToken{Hash: "h1", Org: "o1", RunnerID: "r1", ExpiresAt: future}), store.KeyHash)
		wantErr(t, bt.Create(ctx, store.BootstrapToken{Hash: "h2", Org: "o1", RunnerID: "nope", ExpiresAt: future}), store.ErrNotFound)
		if err := bt.Create(ctx, store.BootstrapToken{Hash: "old", Org: "o1", RunnerID: "r1", ExpiresAt: time.Now().Add(-time.Second)}); err != nil {
			t.Fatal(err)
		}

		tok, err := bt.Consume(ctx, "h1")
		if err != nil || tok.Org != "o1" || tok.RunnerID != "r1" || tok.ConsumedAt == nil ||
			!tok.ExpiresAt.Equal(future.Truncate(time.Microsecond)) {
			t.Fatalf("consume = %+v, %v", tok, err)
		}
		wantUTC(t, tok.ExpiresAt, tok.CreatedAt, *tok.ConsumedAt)
		_, err = bt.Consume(ctx, "h1")
		wantErr(t, err, store.ErrNotFound)
		_, err = bt.Consume(ctx, "old")
		wantErr(t, err, store.ErrNotFound)
		_, err = bt.Consume(ctx, "unknown")
		wantErr(t, err, store.ErrNotFound)

		// Deleting the runner deletes its tokens.
		if err := bt.Create(ctx, store.BootstrapToken{Hash: "h3", Org: "o1", RunnerID: "r1", ExpiresAt: future}); err != nil {
			t.Fatal(err)
		}
		if err := s.Runners().Delete(ctx, "o1", "r1", ""); err != nil {
			t.Fatal(err)
		}
		_, err = bt.Consume(ctx, "h3")
		wantErr(t, err, store.ErrNotFound)
	})
}

func TestBootstrapTokenConsumedOnceUnderConcurrency(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		mustOrg(t, s, "o1")
		mustRunner(t, s, "o1", "r1", "c1")
		for round := range 3 {
			hash := fmt.Sprintf("h%d", round)
			if err := s.BootstrapTokens().Create(t.Context(), store.BootstrapToken{Hash: hash, Org: "o1", RunnerID: "r1",
				ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			const n = 10
			var wg sync.WaitGroup
			errs := make([]error, n)
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					_, errs[i] = s.BootstrapTokens().Consume(t.Context(), hash)
				})
			}
			close(start)
			wg.Wait()
			won := 0
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, store.ErrNotFound):
					t.Fatalf("unexpected error: %v", err)
				}
			}
			if won != 1 {
				t.Fatalf("round %d: %d consumers succeeded, want 1", round, won)
			}
		}
	})
}

func TestRunnerMaintenancePolicy(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		rs := s.Runners()
		mustOrg(t, s, "o1")
		mp := json.RawMessage(`{"windows":[{"cron":"0 2 * * *","duration_seconds":3600}]}`)
		r, err := rs.Create(ctx, store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c1", MaintenancePolicy: mp})
		if err != nil || string(r.MaintenancePolicy) != string(mp) {
			t.Fatalf("create = %s, %v", r.MaintenancePolicy, err)
		}
		if got, err := rs.Get(ctx, "o1", "r1"); err != nil || string(got.MaintenancePolicy) != string(mp) {
			t.Fatalf("get = %s, %v", got.MaintenancePolicy, err)
		}
		// An update that does not name it keeps it.
		u, err := rs.Update(ctx, "o1", "r1", r.Etag, store.RunnerUpdate{DisplayName: ptr("x")})
		if err != nil || string(u.MaintenancePolicy) != string(mp) {
			t.Fatalf("other update = %s, %v", u.MaintenancePolicy, err)
		}
		mp2 := json.RawMessage(`{"exclusions":[{"start_time":"2026-12-24T00:00:00Z","end_time":"2026-12-27T00:00:00Z","reason":"holidays"}]}`)
		u2, err := rs.Update(ctx, "o1", "r1", u.Etag, store.RunnerUpdate{SetMaintenancePolicy: true, MaintenancePolicy: mp2})
		if err != nil || string(u2.MaintenancePolicy) != string(mp2) || u2.Etag == u.Etag || u2.PolicyRevision != 0 {
			t.Fatalf("replace = %+v, %v", u2, err)
		}
		// Stale etag: refused, unchanged.
		_, err = rs.Update(ctx, "o1", "r1", u.Etag, store.RunnerUpdate{SetMaintenancePolicy: true})
		wantErr(t, err, store.ErrConflict)
		u3, err := rs.Update(ctx, "o1", "r1", u2.Etag, store.RunnerUpdate{SetMaintenancePolicy: true})
		if err != nil || u3.MaintenancePolicy != nil {
			t.Fatalf("clear = %s, %v", u3.MaintenancePolicy, err)
		}
		if list, _, err := rs.List(ctx, "o1", store.Page{}); err != nil || len(list) != 1 || list[0].MaintenancePolicy != nil {
			t.Fatalf("list = %+v, %v", list, err)
		}
		_, err = rs.Create(ctx, store.Runner{Org: "o1", RunnerID: "r2", ClusterID: "c2", MaintenancePolicy: json.RawMessage(`[]`)})
		wantErr(t, err, store.ErrInvalid)
		_, err = rs.Update(ctx, "o1", "r1", u3.Etag, store.RunnerUpdate{SetMaintenancePolicy: true, MaintenancePolicy: json.RawMessage(`{`)})
		wantErr(t, err, store.ErrInvalid)
	})
}
