package local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Exports of multi-container gVisor sandboxes (export.go's bundle, what a group adds).
// A group's checkpoint is one sentry's (`runsc checkpoint` of its root container saves
// every container), so its image part is the group's as it is; its volumes are the
// group's (the primary's, once); what a group adds is each member's agent state dir and
// what the restore must know of the members, which the local fork takes from the source
// sandbox (forkParams.members, memberDigests):
//
//	group          a dir holding group.json: the members, in the spec's order
//	               (its sidecars), each its container name and the image digest the
//	               checkpoint was taken on ({"members":[{"name":..,"digest":..}]}).
//	member-<k>     member k's agent state dir (as run is the primary's).
//
// Only groups whose containers all run are exported (a completed init container is an
// ended member: refused, as a local fork of it is), so a group's members are its
// sidecars. The import reads group.json from the staging dir (no link followed,
// bounded), checks it against the spec (the same members, in order; a sha256 digest
// each) and makes each fork as a local fork of a group is made (createGroup with
// forkParams: `runsc restore` of the root container, then of each member), each
// member's image checked to be at its digest (forkDigest). The checkpoint image's own
// list of members (fileCkMembers) is runsc's to check: a restore of a checkpoint that
// holds other containers than the spec names fails, and the fork is undone.

const (
	partGroup       = "group"
	partMember      = "member-"
	fileGroupExport = "group.json"
	maxGroupJSON    = 64 << 10
)

// groupExport is group.json of a group's export.
type groupExport struct {
	Members []groupExportMember `json:"members"`
}

type groupExportMember struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// digestPattern: a digest is only compared (with the pulled image's), never used as a path
var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{1,64}$`)

// groupExportUnsupported says why a group of spec cannot be exported or imported (""
// if it can).
func groupExportUnsupported(spec *runtime.Spec) string {
	if len(spec.InitContainers) > 0 {
		return "moves and cross-runner forks of groups with init containers are not implemented (a completed init container is not in the checkpoint)"
	}
	return ""
}

// groupParts are the parts a group's export adds (none for a single container).
func groupParts(spec *runtime.Spec) []string {
	if !spec.Multi() {
		return nil
	}
	out := []string{partGroup}
	for k := range spec.Sidecars {
		out = append(out, partMember+strconv.Itoa(k))
	}
	return out
}

// groupExportParts writes group.json of group s into a new dir of s's and returns the
// parts that hold it and fp's members' agent state dirs, and what removes that dir.
func (b *Backend) groupExportParts(s *sandbox, fp *forkParams) ([]exportPart, func(), error) {
	if len(s.members) == 0 {
		return nil, func() {}, nil
	}
	if len(s.members) != len(s.spec.Sidecars) {
		return nil, nil, fmt.Errorf("the group has %d containers besides its primary, its spec %d sidecars", len(s.members), len(s.spec.Sidecars))
	}
	dir, err := os.MkdirTemp(s.dir, "export-group-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	var ge groupExport
	parts := []exportPart{{name: partGroup, dir: dir}}
	for k, sc := range s.spec.Sidecars {
		m := s.members[k]
		run := fp.members[m.name]
		if m.name != sc.ContainerName() || run == "" {
			cleanup()
			return nil, nil, fmt.Errorf("container %q: its agent state is not in the checkpoint", sc.ContainerName())
		}
		ge.Members = append(ge.Members, groupExportMember{Name: m.name, Digest: fp.memberDigests[m.name]})
		parts = append(parts, exportPart{name: partMember + strconv.Itoa(k), dir: run})
	}
	if err := writeJSONAtomic(filepath.Join(dir, fileGroupExport), &ge); err != nil {
		cleanup()
		return nil, nil, err
	}
	return parts, cleanup, nil
}

// isGroupPart reports whether part is one of groupParts, and whether it is group.json's.
func isGroupPart(part string) (ok, meta bool) {
	if part == partGroup {
		return true, true
	}
	if rest, found := strings.CutPrefix(part, partMember); found {
		k, err := strconv.Atoi(rest)
		return err == nil && k >= 0 && strconv.Itoa(k) == rest, false
	}
	return false, false
}

// groupPartLimits bounds group (group.json only) and a member's agent state (as the
// primary's, run).
func groupPartLimits(part string, run runtime.ArchiveLimits) runtime.ArchiveLimits {
	if part == partGroup {
		return runtime.ArchiveLimits{MaxBytes: maxGroupJSON, MaxFiles: 4}
	}
	return run
}

// readGroupExport reads stage/group/group.json (sandbox-side content: no link
// followed, bounded, unknown fields refused) and checks it against spec; it sets fp's
// members (their staged agent state dirs) and memberDigests.
func readGroupExport(stage string, spec *runtime.Spec, fp *forkParams) error {
	path := filepath.Join(stage, partGroup, fileGroupExport)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: the checkpoint's %s: %w", runtime.ErrInvalidSpec, fileGroupExport, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: the checkpoint's %s is not a regular file", runtime.ErrInvalidSpec, fileGroupExport)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxGroupJSON+1))
	if err != nil {
		return err
	}
	if len(raw) > maxGroupJSON {
		return fmt.Errorf("%w: the checkpoint's %s is larger than %d bytes", runtime.ErrInvalidSpec, fileGroupExport, maxGroupJSON)
	}
	var ge groupExport
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ge); err != nil {
		return fmt.Errorf("%w: the checkpoint's %s: %w", runtime.ErrInvalidSpec, fileGroupExport, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: the checkpoint's %s: data after the document", runtime.ErrInvalidSpec, fileGroupExport)
	}
	if len(ge.Members) != len(spec.Sidecars) {
		return fmt.Errorf("%w: the checkpoint holds %d containers besides the primary, the spec has %d sidecars", runtime.ErrInvalidSpec, len(ge.Members), len(spec.Sidecars))
	}
	fp.members = map[string]string{}
	fp.memberDigests = map[string]string{}
	for k, m := range ge.Members {
		want := spec.Sidecars[k].ContainerName()
		switch {
		case m.Name != want:
			return fmt.Errorf("%w: the checkpoint's container %d is %q, the spec's sidecar %q", runtime.ErrInvalidSpec, k, textclip.Clip(m.Name, 80), want)
		case !digestPattern.MatchString(m.Digest):
			return fmt.Errorf("%w: the checkpoint's container %q: image digest %q is not sha256:<hex digits>", runtime.ErrInvalidSpec, want, textclip.Clip(m.Digest, 80))
		}
		fp.members[want] = filepath.Join(stage, partMember+strconv.Itoa(k))
		fp.memberDigests[want] = m.Digest
	}
	return nil
}
