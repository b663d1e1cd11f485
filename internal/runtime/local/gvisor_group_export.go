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
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Exports of multi-container gVisor sandboxes (export.go's bundle, what a group adds).
// A group's checkpoint is one sentry's (`runsc checkpoint` of its root container saves
// every container), so its image part is the group's as it is; its volumes are the
// group's (the primary's, once); what a group adds is each member's agent state dir and
// what the restore must know of the members, which the local fork takes from the source
// sandbox (forkParams.members, memberDigests, completed):
//
//	group          a dir holding group.json: the sidecars, in the spec's order, each its
//	               container name and the image digest the checkpoint was taken on, and,
//	               for one that had ended for good before the checkpoint (not in it), its
//	               recorded exit; and the completed init containers, in the spec's order,
//	               each its name and recorded exit
//	               ({"members":[{"name":..,"digest":..,"ended":{"exitCode":..,
//	               "restarts":..,"reason":..,"message":..,"finishedAt":..}}],
//	               "completed":[{"name":..,"exitCode":0,"restarts":..,"reason":..,
//	               "message":..,"finishedAt":..}]}).
//	init-<k>       init container k's agent state dir (its logs and last status).
//	member-<k>     sidecar k's agent state dir (as run is the primary's).
//
// A running group's init containers have all completed (the start sequence runs them to
// exit 0 before the others), so none is in the checkpoint; neither is a sidecar that had
// ended (dropEndedMembers). The import records each as ended with the exit the source
// recorded (its exit code, reason, message, finish time and restarts; an init
// container's exit code 0), never runs it, and restores the sentry with the running
// containers only, as a local fork does (gvisor_group_pause.go). The import reads
// group.json from the staging dir (no link followed, bounded, unknown fields refused),
// checks it against the spec (the same sidecars and init containers, in order; a sha256
// digest each running sidecar; every recorded exit bounded: completedInvalid,
// endedInvalid) and
// makes each fork as a local fork of a group is made (createGroup with forkParams:
// `runsc restore` of the root container, then of each running member), each member's
// image checked to be at its digest (forkDigest). The checkpoint image's own list of
// members (fileCkMembers) is runsc's to check: a restore of a checkpoint that holds
// other containers than the ones group.json says run fails, and the fork is undone.

const (
	partGroup       = "group"
	partMember      = "member-"
	partInit        = "init-"
	fileGroupExport = "group.json"
	maxGroupJSON    = 64 << 10
	// bounds of a completed init container's recorded exit read back from an export
	maxCompletedReason   = 64
	maxCompletedMessage  = 1024
	maxCompletedRestarts = 1 << 20
)

// groupExport is group.json of a group's export.
type groupExport struct {
	Members   []groupExportMember    `json:"members"`
	Completed []groupExportCompleted `json:"completed,omitempty"`
}

type groupExportMember struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	// Ended is the recorded exit of a sidecar that had ended for good before the
	// checkpoint (nil: it runs, the checkpoint holds it).
	Ended *groupExportExit `json:"ended,omitempty"`
}

// groupExportCompleted is a completed init container's recorded exit (runtime.Exit).
type groupExportCompleted struct {
	Name string `json:"name"`
	groupExportExit
}

// groupExportExit is a recorded exit (runtime.Exit) of a container not in the checkpoint.
type groupExportExit struct {
	ExitCode   *int32    `json:"exitCode"`
	Restarts   int       `json:"restarts"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message"`
	FinishedAt time.Time `json:"finishedAt"`
}

// exportExit is ex as group.json records it.
func exportExit(ex runtime.Exit) groupExportExit {
	return groupExportExit{ExitCode: ex.ExitCode, Restarts: ex.Restarts, Reason: ex.Reason, Message: ex.Message, FinishedAt: ex.At.UTC()}
}

// exit is the runtime.Exit e records (checked by the caller).
func (e *groupExportExit) exit() runtime.Exit {
	return runtime.Exit{ExitCode: e.ExitCode, Restarts: e.Restarts, Reason: e.Reason, Message: e.Message, At: e.FinishedAt.UTC()}
}

// digestPattern: a digest is only compared (with the pulled image's), never used as a path
var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{1,64}$`)

// reasonPattern: a recorded exit's reason is a short CamelCase word (runtime.Exit)
var reasonPattern = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// groupParts are the parts a group's export adds (none for a single container).
func groupParts(spec *runtime.Spec) []string {
	if !spec.Multi() {
		return nil
	}
	out := []string{partGroup}
	for k := range spec.InitContainers {
		out = append(out, partInit+strconv.Itoa(k))
	}
	for k := range spec.Sidecars {
		out = append(out, partMember+strconv.Itoa(k))
	}
	return out
}

// groupExportParts writes group.json of group s into a new dir of s's and returns the
// parts that hold it, fp's completed init containers' and members' agent state dirs,
// and what removes that dir.
func (b *Backend) groupExportParts(s *sandbox, fp *forkParams) ([]exportPart, func(), error) {
	if len(s.members) == 0 {
		return nil, func() {}, nil
	}
	if len(s.members) != len(s.spec.Sidecars)+len(s.spec.InitContainers) {
		return nil, nil, fmt.Errorf("the group has %d containers besides its primary, its spec %d", len(s.members), len(s.spec.Sidecars)+len(s.spec.InitContainers))
	}
	dir, err := os.MkdirTemp(s.dir, "export-group-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	var ge groupExport
	parts := []exportPart{{name: partGroup, dir: dir}}
	for k, ic := range s.spec.InitContainers {
		name := ic.ContainerName()
		c, ok := fp.completed[name]
		if !ok || c.run == "" {
			cleanup()
			return nil, nil, fmt.Errorf("init container %q: its completion is not recorded", name)
		}
		ge.Completed = append(ge.Completed, groupExportCompleted{Name: name, groupExportExit: exportExit(c.exit)})
		parts = append(parts, exportPart{name: partInit + strconv.Itoa(k), dir: c.run})
	}
	for k, sc := range s.spec.Sidecars {
		name := sc.ContainerName()
		gm := groupExportMember{Name: name, Digest: fp.memberDigests[name]}
		run := fp.members[name]
		if c, ended := fp.completed[name]; ended && run == "" {
			ex := exportExit(endedExit(c.exit, time.Now())) // bounded as the import wants it
			gm.Ended, run = &ex, c.run
		}
		if run == "" {
			cleanup()
			return nil, nil, fmt.Errorf("container %q: its agent state is not in the checkpoint", name)
		}
		ge.Members = append(ge.Members, gm)
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
	for _, prefix := range []string{partMember, partInit} {
		if rest, found := strings.CutPrefix(part, prefix); found {
			k, err := strconv.Atoi(rest)
			return err == nil && k >= 0 && strconv.Itoa(k) == rest, false
		}
	}
	return false, false
}

// groupPartLimits bounds group (group.json only) and a member's or completed init
// container's agent state (as the primary's, run).
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
	if len(ge.Completed) != len(spec.InitContainers) {
		return fmt.Errorf("%w: the checkpoint records %d completed init containers, the spec has %d", runtime.ErrInvalidSpec, len(ge.Completed), len(spec.InitContainers))
	}
	fp.members = map[string]string{}
	fp.memberDigests = map[string]string{}
	fp.completed = map[string]completedMember{}
	for k, m := range ge.Members {
		want := spec.Sidecars[k].ContainerName()
		switch {
		case m.Name != want:
			return fmt.Errorf("%w: the checkpoint's container %d is %q, the spec's sidecar %q", runtime.ErrInvalidSpec, k, textclip.Clip(m.Name, 80), want)
		case !digestPattern.MatchString(m.Digest) && (m.Ended == nil || m.Digest != ""): // an ended one's is not used
			return fmt.Errorf("%w: the checkpoint's container %q: image digest %q is not sha256:<hex digits>", runtime.ErrInvalidSpec, want, textclip.Clip(m.Digest, 80))
		}
		run := filepath.Join(stage, partMember+strconv.Itoa(k))
		fp.memberDigests[want] = m.Digest
		if m.Ended == nil {
			fp.members[want] = run
			continue
		}
		if why := endedInvalid(m.Ended, time.Now()); why != "" {
			return fmt.Errorf("%w: the checkpoint's ended sidecar %q: %s", runtime.ErrInvalidSpec, want, why)
		}
		fp.completed[want] = completedMember{exit: m.Ended.exit(), run: run}
	}
	for k, c := range ge.Completed {
		want := spec.InitContainers[k].ContainerName()
		if c.Name != want {
			return fmt.Errorf("%w: the checkpoint's completed init container %d is %q, the spec's %q", runtime.ErrInvalidSpec, k, textclip.Clip(c.Name, 80), want)
		}
		if why := completedInvalid(&c.groupExportExit, time.Now()); why != "" {
			return fmt.Errorf("%w: the checkpoint's init container %q: %s", runtime.ErrInvalidSpec, want, why)
		}
		fp.completed[want] = completedMember{exit: c.exit(), run: filepath.Join(stage, partInit+strconv.Itoa(k))}
	}
	return nil
}

// completedInvalid says what is wrong with a completed init container's exit read back
// from an export ("" if nothing): the importing runner records it as it is, so every
// field is bounded, and the exit code must be 0.
func completedInvalid(c *groupExportExit, now time.Time) string {
	if c.ExitCode == nil || *c.ExitCode != 0 {
		return "not completed with exit code 0"
	}
	return exitInvalid(c, now)
}

// endedReasons are the reasons a sidecar that ended for good is recorded with: the
// agent's final ones (internal/agent: Completed, Error, RestartLimit, StartError,
// Stopped) and the runner's (lifecycle.go: OOMKilled, Killed, Vanished).
var endedReasons = []string{"Completed", "Error", "RestartLimit", "StartError", "Stopped", "OOMKilled", "Killed", "Vanished"}

// maxExitCode: an exit code is a process's (0-255; killed by signal n: 128+n), as the
// agent reports it.
const maxExitCode = 255

// endedInvalid says what is wrong with the exit of a sidecar that ended for good read
// back from an export ("" if nothing): an exit code in [0, 255] or none (the command
// never ran to its end), one of endedReasons (Completed only with exit code 0), and
// every field bounded as completedInvalid's.
func endedInvalid(c *groupExportExit, now time.Time) string {
	switch {
	case c.ExitCode != nil && (*c.ExitCode < 0 || *c.ExitCode > maxExitCode):
		return fmt.Sprintf("exit code %d out of range [0, %d]", *c.ExitCode, maxExitCode)
	case !slices.Contains(endedReasons, c.Reason):
		return fmt.Sprintf("reason %q is not one of %s", textclip.Clip(c.Reason, 80), strings.Join(endedReasons, ", "))
	case c.Reason == "Completed" && (c.ExitCode == nil || *c.ExitCode != 0):
		return "reason Completed without exit code 0"
	}
	return exitInvalid(c, now)
}

// exitInvalid says what is wrong with the bounded fields of a recorded exit read back
// from an export ("" if nothing).
func exitInvalid(c *groupExportExit, now time.Time) string {
	switch {
	case c.Restarts < 0 || c.Restarts > maxCompletedRestarts:
		return fmt.Sprintf("restart count %d out of range [0, %d]", c.Restarts, maxCompletedRestarts)
	case len(c.Reason) > maxCompletedReason || !reasonPattern.MatchString(c.Reason):
		return fmt.Sprintf("reason %q is not a CamelCase word of at most %d characters", textclip.Clip(c.Reason, 80), maxCompletedReason)
	case len(c.Message) > maxCompletedMessage:
		return fmt.Sprintf("message longer than %d bytes", maxCompletedMessage)
	case !utf8.ValidString(c.Message) || strings.ContainsFunc(c.Message, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' }):
		return "message is not printable UTF-8"
	case c.FinishedAt.IsZero() || c.FinishedAt.Year() < 2000 || c.FinishedAt.After(now.Add(24*time.Hour)):
		return fmt.Sprintf("finish time %s out of range", c.FinishedAt.UTC().Format(time.RFC3339))
	}
	return ""
}

// endedExit is the exit of a sidecar that ended for good as forks record it: the
// source's, held to what endedInvalid accepts (its agent's status, which the sandbox can
// write, fed it), so that an export of it imports: an exit code out of range is dropped
// (none), an unknown reason is Error (Completed needs exit code 0), the restart count
// clipped, the message cut to its bound and its control characters replaced, a finish
// time out of range now's.
func endedExit(ex runtime.Exit, now time.Time) runtime.Exit {
	if ex.ExitCode != nil {
		c := *ex.ExitCode
		ex.ExitCode = &c
		if c < 0 || c > maxExitCode {
			ex.ExitCode = nil
		}
	}
	ex = ex.WithDefaultReason()
	if !slices.Contains(endedReasons, ex.Reason) || (ex.Reason == "Completed" && (ex.ExitCode == nil || *ex.ExitCode != 0)) {
		ex.Reason = "Error"
	}
	ex.Restarts = min(max(ex.Restarts, 0), maxCompletedRestarts)
	msg := strings.Map(func(r rune) rune {
		if r == utf8.RuneError || (unicode.IsControl(r) && r != '\n' && r != '\t') {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(ex.Message, "?"))
	if len(msg) > maxCompletedMessage {
		cut := maxCompletedMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	ex.Message = msg
	ex.At = ex.At.UTC()
	if ex.At.IsZero() || ex.At.Year() < 2000 || ex.At.After(now.Add(24*time.Hour)) { // as exitInvalid
		ex.At = now.UTC()
	}
	return ex
}
