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

const releaseCols = `version, runner_image_digest, agent_image_digest, binary_checksums, agent_binary_checksums,
	manifest, manifest_signature, created_at, rapid_at, stable_at`

func scanRelease(r row) (Release, error) {
	var x Release
	var sums, agentSums dbJSON
	var created, rapid, stable dbTime
	if err := r.Scan(&x.Version, &x.RunnerImageDigest, &x.AgentImageDigest, &sums, &agentSums,
		&x.Manifest, &x.ManifestSignature, &created, &rapid, &stable); err != nil {
		return Release{}, err
	}
	var err error
	if x.BinaryChecksums, err = scanChecksums(sums); err != nil {
		return Release{}, fmt.Errorf("release %s binary_checksums: %w", x.Version, err)
	}
	if x.AgentBinaryChecksums, err = scanChecksums(agentSums); err != nil {
		return Release{}, fmt.Errorf("release %s agent_binary_checksums: %w", x.Version, err)
	}
	if len(x.Manifest) == 0 {
		x.Manifest = nil
	}
	if len(x.ManifestSignature) == 0 {
		x.ManifestSignature = nil
	}
	x.CreatedAt, x.RapidAt, x.StableAt = created.t, rapid.ptr(), stable.ptr()
	return x, nil
}

// scanChecksums decodes a stored checksum object; an empty one is nil.
func scanChecksums(b dbJSON) (map[string]string, error) {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

// checksumsArg is a checksum object as a statement argument (map keys sorted by
// encoding/json: one spelling per set; nil is {}).
func checksumsArg(m map[string]string) (string, error) {
	if m == nil {
		m = map[string]string{}
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// bytesArg is an optional byte string as a statement argument: NULL when empty (drivers
// differ on whether a nil []byte is NULL or an empty blob).
func bytesArg(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// CheckRelease validates what Publish stores: the version, both image digests, every
// binary checksum (package release), and that a manifest comes with its signature, both
// within bounds. It does not verify the signature: the control plane does, with its
// trusted keys, before it publishes.
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
	for _, arch := range slices.Sorted(maps.Keys(r.AgentBinaryChecksums)) {
		if err := release.CheckArch(arch); err != nil {
			return invalid("agent_binary_checksums: %v", err)
		}
		if err := release.CheckChecksum(r.AgentBinaryChecksums[arch]); err != nil {
			return invalid("agent_binary_checksums[%s] %v", arch, err)
		}
	}
	switch {
	case (len(r.Manifest) == 0) != (len(r.ManifestSignature) == 0):
		return invalid("a release manifest and its signature are stored together or not at all")
	case len(r.Manifest) > release.MaxManifestBytes:
		return invalid("manifest is %d bytes; at most %d", len(r.Manifest), release.MaxManifestBytes)
	case len(r.ManifestSignature) > release.MaxSignatureBytes:
		return invalid("manifest_signature is %d bytes; at most %d", len(r.ManifestSignature), release.MaxSignatureBytes)
	}
	return nil
}

func (rl releases) Publish(ctx context.Context, r Release) (Release, error) {
	if err := CheckRelease(r); err != nil {
		return Release{}, err
	}
	sums, err := checksumsArg(r.BinaryChecksums)
	if err != nil {
		return Release{}, err
	}
	agentSums, err := checksumsArg(r.AgentBinaryChecksums)
	if err != nil {
		return Release{}, err
	}
	t := now()
	out, err := scanRelease(rl.s.d.queryRow(ctx, `INSERT INTO releases (version, runner_image_digest,
		agent_image_digest, binary_checksums, agent_binary_checksums, manifest, manifest_signature,
		created_at, rapid_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)
		RETURNING `+releaseCols,
		r.Version, r.RunnerImageDigest, r.AgentImageDigest, sums, agentSums,
		bytesArg(r.Manifest), bytesArg(r.ManifestSignature), t))
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
