package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/sandboxd/sandboxd/internal/release"
)

// ---- releases ----

type releases struct{ s *sqlStore }

func (s *sqlStore) Releases() Releases { return releases{s} }

const releaseCols = `version, runner_image_digest, agent_image_digest, binary_checksums, created_at, rapid_at, stable_at`

func scanRelease(r row) (Release, error) {
	var x Release
	var sums dbJSON
	var created, rapid, stable dbTime
	if err := r.Scan(&x.Version, &x.RunnerImageDigest, &x.AgentImageDigest, &sums, &created, &rapid, &stable); err != nil {
		return Release{}, err
	}
	if err := json.Unmarshal(sums, &x.BinaryChecksums); err != nil {
		return Release{}, fmt.Errorf("release %s binary_checksums: %w", x.Version, err)
	}
	if len(x.BinaryChecksums) == 0 {
		x.BinaryChecksums = nil
	}
	x.CreatedAt, x.RapidAt, x.StableAt = created.t, rapid.ptr(), stable.ptr()
	return x, nil
}

// CheckRelease validates what Publish stores: the version, both image digests and every
// binary checksum (package release).
func CheckRelease(r Release) error {
	if _, err := release.ParseVersion(r.Version); err != nil {
		return invalid("version %v", err)
	}
	if err := release.CheckDigest(r.RunnerImageDigest); err != nil {
		return invalid("runner_image_digest %v", err)
	}
	if err := release.CheckDigest(r.AgentImageDigest); err != nil {
		return invalid("agent_image_digest %v", err)
	}
	for _, arch := range slices.Sorted(maps.Keys(r.BinaryChecksums)) {
		if err := release.CheckArch(arch); err != nil {
			return invalid("binary_checksums: %v", err)
		}
		if err := release.CheckChecksum(r.BinaryChecksums[arch]); err != nil {
			return invalid("binary_checksums[%s] %v", arch, err)
		}
	}
	return nil
}

func (rl releases) Publish(ctx context.Context, r Release) (Release, error) {
	if err := CheckRelease(r); err != nil {
		return Release{}, err
	}
	sums := r.BinaryChecksums
	if sums == nil {
		sums = map[string]string{}
	}
	b, err := json.Marshal(sums) // map keys sorted: one spelling per set
	if err != nil {
		return Release{}, err
	}
	t := now()
	out, err := scanRelease(rl.s.d.queryRow(ctx, `INSERT INTO releases (version, runner_image_digest,
		agent_image_digest, binary_checksums, created_at, rapid_at) VALUES ($1, $2, $3, $4, $5, $5)
		RETURNING `+releaseCols,
		r.Version, r.RunnerImageDigest, r.AgentImageDigest, string(b), t))
	if err != nil {
		return Release{}, rl.s.writeErr("release", "publish", err)
	}
	return out, nil
}

func (rl releases) Get(ctx context.Context, version string) (Release, error) {
	return getRelease(ctx, rl.s, rl.s.d, version)
}

func getRelease(ctx context.Context, s *sqlStore, q querier, version string) (Release, error) {
	x, err := scanRelease(q.queryRow(ctx, `SELECT `+releaseCols+` FROM releases WHERE version = $1`, version))
	if err != nil {
		return Release{}, s.readErr("release "+version, err)
	}
	return x, nil
}

func (rl releases) List(ctx context.Context) ([]Release, error) {
	return listReleases(ctx, rl.s.d, "")
}

func listReleases(ctx context.Context, q querier, where string) ([]Release, error) {
	rs, err := q.query(ctx, `SELECT `+releaseCols+` FROM releases `+where)
	if err != nil {
		return nil, fmt.Errorf("list releases: %w", err)
	}
	defer rs.Close()
	var out []Release
	for rs.Next() {
		x, err := scanRelease(rs)
		if err != nil {
			return nil, fmt.Errorf("list releases: %w", err)
		}
		out = append(out, x)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("list releases: %w", err)
	}
	slices.SortFunc(out, func(a, b Release) int { return release.CompareVersions(b.Version, a.Version) })
	return out, nil
}

// Promote checks and writes in one transaction. Two promotions racing on PostgreSQL may
// both pass the "not older" check; the channel's current version is the highest it
// offers either way.
func (rl releases) Promote(ctx context.Context, version string) (Release, error) {
	var out Release
	err := rl.s.d.tx(ctx, func(q querier) error {
		cur, err := getRelease(ctx, rl.s, q, version)
		if err != nil {
			return err
		}
		if cur.StableAt != nil {
			out = cur
			return nil
		}
		if cur.RapidAt == nil {
			return fmt.Errorf("release %s: %w: publish it first", version, ErrNotOnRapid)
		}
		stable, err := listReleases(ctx, q, `WHERE stable_at IS NOT NULL`)
		if err != nil {
			return err
		}
		if len(stable) > 0 && release.CompareVersions(version, stable[0].Version) < 0 {
			return fmt.Errorf("release %s: %w %s", version, ErrOlderThanStable, stable[0].Version)
		}
		out, err = scanRelease(q.queryRow(ctx, `UPDATE releases SET stable_at = $2 WHERE version = $1
			RETURNING `+releaseCols, version, now()))
		return err
	})
	if err != nil {
		return Release{}, err
	}
	return out, nil
}

// CurrentVersions returns each channel's current version among rs: the highest version
// the channel offers; a channel that offers none is absent.
func CurrentVersions(rs []Release) map[string]string {
	out := map[string]string{}
	for _, r := range rs {
		for _, ch := range r.Channels() {
			if cur, ok := out[ch]; !ok || release.CompareVersions(r.Version, cur) > 0 {
				out[ch] = r.Version
			}
		}
	}
	return out
}
