package store_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
)

var (
	sumA = strings.Repeat("a1", 32)
	sumB = strings.Repeat("b2", 32)
)

func rel(version string) store.Release {
	return store.Release{Version: version, RunnerImageDigest: "sha256:" + sumA, AgentImageDigest: "sha256:" + sumB,
		BinaryChecksums: map[string]string{"amd64": sumA, "arm64": sumB}}
}

func mustPublish(t *testing.T, s store.Store, version string) store.Release {
	t.Helper()
	r, err := s.Releases().Publish(t.Context(), rel(version))
	if err != nil {
		t.Fatalf("publish %s: %v", version, err)
	}
	return r
}

func currentVersions(t *testing.T, s store.Store) map[string]string {
	t.Helper()
	rs, err := s.Releases().List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return store.CurrentVersions(rs)
}

func TestReleasesPublishAndList(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		if rs, err := s.Releases().List(ctx); err != nil || len(rs) != 0 {
			t.Fatalf("empty list: %v %v", rs, err)
		}
		r := mustPublish(t, s, "v1.2.0")
		wantUTC(t, r.CreatedAt)
		if r.RapidAt == nil || !r.RapidAt.Equal(r.CreatedAt) || r.StableAt != nil {
			t.Fatalf("published: %+v", r)
		}
		if got := r.Channels(); len(got) != 1 || got[0] != store.ChannelRapid {
			t.Fatalf("channels %v", got)
		}
		got, err := s.Releases().Get(ctx, "v1.2.0")
		if err != nil || got.RunnerImageDigest != r.RunnerImageDigest || got.BinaryChecksums["arm64"] != sumB ||
			len(got.BinaryChecksums) != 2 || !got.CreatedAt.Equal(r.CreatedAt) {
			t.Fatalf("get: %+v %v", got, err)
		}
		_, err = s.Releases().Publish(ctx, rel("v1.2.0"))
		wantKey(t, err, store.KeyVersion)
		_, err = s.Releases().Get(ctx, "v9.9.9")
		wantErr(t, err, store.ErrNotFound)

		// Images only: no checksums.
		noBin := rel("v1.10.0-rc.1")
		noBin.BinaryChecksums = nil
		if r, err := s.Releases().Publish(ctx, noBin); err != nil || r.BinaryChecksums != nil {
			t.Fatalf("publish without checksums: %+v %v", r, err)
		}
		mustPublish(t, s, "v1.9.0")
		mustPublish(t, s, "1.10.0")
		rs, err := s.Releases().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		for _, r := range rs {
			order = append(order, r.Version)
		}
		if strings.Join(order, " ") != "1.10.0 v1.10.0-rc.1 v1.9.0 v1.2.0" {
			t.Fatalf("list order %v: want highest version first", order)
		}
		if cur := currentVersions(t, s); cur[store.ChannelRapid] != "1.10.0" || cur[store.ChannelStable] != "" {
			t.Fatalf("current %v", cur)
		}
	})
}

func TestReleasesPublishValidates(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		for name, edit := range map[string]func(r *store.Release){
			"version missing":      func(r *store.Release) { r.Version = "" },
			"version not semver":   func(r *store.Release) { r.Version = "latest" },
			"build metadata":       func(r *store.Release) { r.Version = "1.0.0+x" },
			"runner digest":        func(r *store.Release) { r.RunnerImageDigest = sumA },
			"agent digest missing": func(r *store.Release) { r.AgentImageDigest = "" },
			"unknown arch":         func(r *store.Release) { r.BinaryChecksums = map[string]string{"x86_64": sumA} },
			"checksum uppercase":   func(r *store.Release) { r.BinaryChecksums = map[string]string{"amd64": strings.ToUpper(sumA)} },
		} {
			r := rel("1.0.0")
			edit(&r)
			if _, err := s.Releases().Publish(t.Context(), r); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", name, err)
			}
		}
		if rs, _ := s.Releases().List(t.Context()); len(rs) != 0 {
			t.Fatalf("invalid releases stored: %v", rs)
		}
	})
}

func TestReleasesPromote(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustPublish(t, s, "v1.0.0")
		mustPublish(t, s, "v1.1.0")
		_, err := s.Releases().Promote(ctx, "v2.0.0")
		wantErr(t, err, store.ErrNotFound)

		p, err := s.Releases().Promote(ctx, "v1.1.0")
		if err != nil || p.StableAt == nil || p.RapidAt == nil || len(p.Channels()) != 2 {
			t.Fatalf("promote: %+v %v", p, err)
		}
		if cur := currentVersions(t, s); cur[store.ChannelStable] != "v1.1.0" || cur[store.ChannelRapid] != "v1.1.0" {
			t.Fatalf("current %v", cur)
		}
		// Again: nothing changes.
		again, err := s.Releases().Promote(ctx, "v1.1.0")
		if err != nil || !again.StableAt.Equal(*p.StableAt) {
			t.Fatalf("promote again: %+v %v", again, err)
		}
		// Older than the current STABLE: refused, and says which is current.
		_, err = s.Releases().Promote(ctx, "v1.0.0")
		wantErr(t, err, store.ErrOlderThanStable)
		if !strings.Contains(err.Error(), "v1.1.0") {
			t.Fatalf("error does not name the current STABLE version: %v", err)
		}
		if r, _ := s.Releases().Get(ctx, "v1.0.0"); r.StableAt != nil {
			t.Fatal("refused promotion was written")
		}
		// A newer one moves STABLE on; RAPID offers its highest version throughout.
		mustPublish(t, s, "v1.2.0-rc.1")
		mustPublish(t, s, "v1.3.0")
		if _, err := s.Releases().Promote(ctx, "v1.2.0-rc.1"); err != nil {
			t.Fatal(err)
		}
		if cur := currentVersions(t, s); cur[store.ChannelStable] != "v1.2.0-rc.1" || cur[store.ChannelRapid] != "v1.3.0" {
			t.Fatalf("current %v", cur)
		}
	})
}

func TestReleasesPromoteRequiresRapid(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn)
		mustPublish(t, s, "v1.0.0")
		// Publish always puts a version on RAPID; a record that is not (written by hand
		// here) is refused.
		rawExec(t, dsn, `UPDATE releases SET rapid_at = NULL WHERE version = 'v1.0.0'`)
		_, err := s.Releases().Promote(t.Context(), "v1.0.0")
		wantErr(t, err, store.ErrNotOnRapid)
		if r, _ := s.Releases().Get(t.Context(), "v1.0.0"); r.RapidAt != nil || len(r.Channels()) != 0 {
			t.Fatalf("record %+v", r)
		}
	})
}

func TestReleasesConcurrentPublishOneWins(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				_, err := s.Releases().Publish(t.Context(), rel("v3.0.0"))
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		ok := 0
		for err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, store.ErrAlreadyExists):
				t.Fatalf("publish: %v", err)
			}
		}
		if ok != 1 {
			t.Fatalf("%d publishes succeeded, want 1", ok)
		}
	})
}

// A release published from a signed manifest keeps the manifest's bytes and signature
// exactly, and its agent checksums, on both backends.
func TestReleasesManifestRoundTrip(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		r := rel("v2.0.0")
		r.AgentBinaryChecksums = map[string]string{"arm64": sumA}
		r.Manifest = []byte("{\"version\":\"v2.0.0\"}\n\x00\xff") // bytes, not text: kept as sent
		r.ManifestSignature = []byte(strings.Repeat("\x01\xfe", 32))
		out, err := s.Releases().Publish(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Releases().Get(ctx, "v2.0.0")
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []store.Release{out, got} {
			if string(x.Manifest) != string(r.Manifest) || string(x.ManifestSignature) != string(r.ManifestSignature) ||
				len(x.AgentBinaryChecksums) != 1 || x.AgentBinaryChecksums["arm64"] != sumA || x.BinaryChecksums["amd64"] != sumA {
				t.Fatalf("stored %+v", x)
			}
		}
		// A record without a manifest has none (nil, not empty), nor agent checksums.
		plain := mustPublish(t, s, "v1.0.0")
		if plain.Manifest != nil || plain.ManifestSignature != nil || plain.AgentBinaryChecksums != nil {
			t.Fatalf("plain release: %+v", plain)
		}
		rs, err := s.Releases().List(ctx)
		if err != nil || len(rs) != 2 || rs[0].Manifest == nil || rs[1].Manifest != nil {
			t.Fatalf("list: %+v %v", rs, err)
		}
	})
}

func TestReleasesManifestValidates(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		sig := []byte(strings.Repeat("s", 64))
		for name, edit := range map[string]func(r *store.Release){
			"manifest without signature": func(r *store.Release) { r.Manifest = []byte("{}") },
			"signature without manifest": func(r *store.Release) { r.ManifestSignature = sig },
			"signature too long":         func(r *store.Release) { r.Manifest, r.ManifestSignature = []byte("{}"), append(sig, 's') },
			"manifest too long": func(r *store.Release) {
				r.Manifest, r.ManifestSignature = []byte(strings.Repeat(" ", 16<<10+1)), sig
			},
			"agent arch":     func(r *store.Release) { r.AgentBinaryChecksums = map[string]string{"x86_64": sumA} },
			"agent checksum": func(r *store.Release) { r.AgentBinaryChecksums = map[string]string{"amd64": "abc"} },
		} {
			r := rel("1.0.0")
			edit(&r)
			if _, err := s.Releases().Publish(t.Context(), r); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", name, err)
			}
		}
		if rs, _ := s.Releases().List(t.Context()); len(rs) != 0 {
			t.Fatalf("invalid releases stored: %v", rs)
		}
	})
}
