package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestExportGroupMove moves a checkpointed two-container gVisor group (a shared disk
// volume) through an export, as a move to another runner does: exported as it is (it
// stays paused), destroyed, and made again from the export under the same ID: both
// containers continue their counters from memory, keep their root filesystems' and the
// volume's files, and have a (new) address. Then the moved group, running, is exported
// again and forked from the export (a cross-runner fork): the fork's containers continue
// on their own, with their own address. Spec mismatches and a tampered group.json are
// refused, leaving nothing; Destroy leaves nothing.
func TestExportGroupMove(t *testing.T) {
	e := exportEnv(t)
	e.withNetwork(t, 16)
	ctx := context.Background()
	store := newCkStore(t)
	const id = "gmv-1"
	vm := []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass, Volumes: []runtime.Volume{{Name: "shared", SizeBytes: 64 << 20}},
		Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}, VolumeMounts: vm,
			Resources: runtime.Resources{MemoryBytes: 256 << 20}},
		Sidecars: []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}, VolumeMounts: vm,
			Resources: runtime.Resources{MemoryBytes: 128 << 20}}}}
	info0 := e.create(sp)
	shIn(t, e.b, id, "app", "echo a > /rootfile; echo v > /data/f")
	shIn(t, e.b, id, "side", "echo s > /rootfile")
	a1 := waitCount(t, e.b, id, 3)
	waitFor(t, func() bool { return groupCounter(t, e.b, id, "side") >= 3 })
	s1 := groupCounter(t, e.b, id, "side")
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ex, err := e.b.ExportCheckpoint(ctx, id, store.put("gmv"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export of a checkpointed group: %v, %d bytes of content, parts %v", time.Since(start), ex.Bytes, ex.Parts)
	if want := []string{"image", "run", "group", "member-0", "volume-0"}; !slices.Equal(ex.Parts, want) {
		t.Errorf("parts %v, want %v", ex.Parts, want)
	}
	if ex.Took != 0 || !e.b.isPaused(id) {
		t.Errorf("the export of a checkpointed group paused it for %v / left it not paused", ex.Took)
	}
	if ents, _ := filepath.Glob(filepath.Join(e.b.dir(id), "export-group-*")); len(ents) > 0 {
		t.Errorf("the export's group dir left: %v", ents)
	}
	if err := e.b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)

	pinned := func(fid string) *runtime.Spec {
		f := sp.Clone()
		f.ID = fid
		f.Image = "busybox@sha256:b0b0"
		return &f
	}
	// Refusals before anything is made: a sidecar that is not the checkpoint's, parts
	// without the member's.
	bad := pinned("gmv-bad")
	bad.Sidecars[0].Args = []string{"-c", "sleep 1000"}
	ref := pinned("gmv-ref")
	_, errs0 := e.b.ForkFromCheckpoint(ctx, ex, store.open("gmv"), []*runtime.Spec{ref, bad})
	if !errors.Is(errs0[1], runtime.ErrInvalidSpec) || !strings.Contains(errs0[1].Error(), `container "side"`) {
		t.Errorf("a fork whose sidecar is not the checkpoint's: %v, want refused", errs0[1])
	}
	if errs0[0] != nil {
		t.Errorf("the other fork of that call: %v", errs0[0])
	} else if err := e.b.Destroy(ctx, ref.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, bad.ID)
	checkNoLeaks(t, e.state, ref.ID)
	noMember := ex
	noMember.Parts = []string{"image", "run", "group", "volume-0"}
	if _, errs := e.b.ForkFromCheckpoint(ctx, noMember, store.open("gmv"), []*runtime.Spec{pinned("gmv-bad")}); !errors.Is(errs[0], runtime.ErrInvalidSpec) {
		t.Errorf("parts without the member's: %v, want refused", errs[0])
	}
	checkNoImportLeft(t, e)

	// The move.
	start = time.Now()
	infos, errs := e.b.ForkFromCheckpoint(ctx, ex, store.open("gmv"), []*runtime.Spec{pinned(id)})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	movedIP := infos[0].IP
	t.Logf("move of a two-container group (import and restore): %v", time.Since(start))
	checkNoImportLeft(t, e)
	if infos[0].ID != id || infos[0].IP == "" {
		t.Errorf("moved group's info %+v (before: %+v)", infos[0], info0)
	}
	a2, s2 := count(t, e.b, id), groupCounter(t, e.b, id, "side")
	if a2 < a1 || a2 > a1+10 || s2 < s1 || s2 > s1+10 {
		t.Errorf("counters app %d side %d after the move, %d %d before: not continued", a2, s2, a1, s1)
	}
	waitCount(t, e.b, id, a2+2)
	waitFor(t, func() bool { return groupCounter(t, e.b, id, "side") >= s2+2 })
	for c, want := range map[string]string{"app": "a", "side": "s"} {
		if out := shIn(t, e.b, id, c, "cat /rootfile /data/f; hostname; ip -4 addr"); !strings.HasPrefix(out, want+"\nv\n"+id+"\n") || !strings.Contains(out, infos[0].IP+"/") {
			t.Errorf("%s after the move: files, hostname, address = %q", c, out)
		}
	}
	if sts, err := e.b.ContainerStatuses(ctx, id); err != nil || len(sts) != 2 {
		t.Errorf("statuses after the move: %+v, %v", sts, err)
	}

	// A fork from an export of the running (moved) group.
	start = time.Now()
	ex2, err := e.b.ExportCheckpoint(ctx, id, store.put("gfk"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export of a running group: %v (paused %v), %d bytes", time.Since(start), ex2.Took, ex2.Bytes)
	a3, s3 := count(t, e.b, id), groupCounter(t, e.b, id, "side")
	const fid = "gmv-fork"
	start = time.Now()
	infos, errs = e.b.ForkFromCheckpoint(ctx, ex2, store.open("gfk"), []*runtime.Spec{pinned(fid)})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	t.Logf("fork of a two-container group from an export: %v", time.Since(start))
	if infos[0].IP == "" || infos[0].IP == movedIP {
		t.Errorf("fork's IP %q", infos[0].IP)
	}
	fa, fs := count(t, e.b, fid), groupCounter(t, e.b, fid, "side")
	if fa < a2 || fs < s2 || fa > a3+10 || fs > s3+10 {
		t.Errorf("fork's counters app %d side %d; the source had %d %d at the export", fa, fs, a3, s3)
	}
	shIn(t, e.b, fid, "side", "echo forked > /data/f")
	waitFor(t, func() bool { return groupCounter(t, e.b, fid, "side") >= fs+2 })
	if out := shIn(t, e.b, id, "app", "cat /data/f"); out != "v" {
		t.Errorf("the fork's volume write reached the source: %q", out)
	}
	if out := shIn(t, e.b, fid, "app", "cat /data/f; cat /rootfile; hostname"); out != "forked\na\n"+fid {
		t.Errorf("fork's app: %q", out)
	}
	for _, x := range []string{fid, id} {
		if err := e.b.Destroy(ctx, x); err != nil {
			t.Fatal(err)
		}
		checkNoLeaks(t, e.state, x)
	}
	checkNoImportLeft(t, e)
}

// TestReadGroupExport: group.json of an import is read without following a link,
// bounded, strict, and must name the spec's sidecars in order, each with a sha256
// digest.
func TestReadGroupExport(t *testing.T) {
	spec := &runtime.Spec{Container: runtime.Container{Name: "app"}, Sidecars: []runtime.Container{{Name: "a"}, {Name: "b"}}}
	write := func(t *testing.T, body string) string {
		stage := t.TempDir()
		if err := os.Mkdir(filepath.Join(stage, partGroup), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stage, partGroup, fileGroupExport), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return stage
	}
	good := `{"members":[{"name":"a","digest":"sha256:0a0a"},{"name":"b","digest":"sha256:0b0b"}]}`
	fp := &forkParams{}
	stage := write(t, good)
	if err := readGroupExport(stage, spec, fp); err != nil {
		t.Fatal(err)
	}
	if fp.members["b"] != filepath.Join(stage, "member-1") || fp.memberDigests["a"] != "sha256:0a0a" {
		t.Errorf("members %v, digests %v", fp.members, fp.memberDigests)
	}
	for what, body := range map[string]string{
		"unknown field":    `{"members":[],"x":1}`,
		"too few":          `{"members":[{"name":"a","digest":"sha256:0a0a"}]}`,
		"another order":    `{"members":[{"name":"b","digest":"sha256:0a0a"},{"name":"a","digest":"sha256:0b0b"}]}`,
		"bad digest":       `{"members":[{"name":"a","digest":"../../x"},{"name":"b","digest":"sha256:0b0b"}]}`,
		"trailing data":    good + `{}`,
		"larger than 64K":  `{"members":[` + strings.Repeat(" ", maxGroupJSON) + `]}`,
		"not json":         `nope`,
		"no digest at all": `{"members":[{"name":"a"},{"name":"b"}]}`,
	} {
		if err := readGroupExport(write(t, body), spec, &forkParams{}); err == nil {
			t.Errorf("%s: accepted", what)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}
	// A group with an init container: its completion is recorded (exit code 0, bounded
	// fields), in the spec's order, and nothing else is accepted.
	initSpec := spec.Clone()
	initSpec.InitContainers = []runtime.Container{{Name: "i1"}}
	members := `"members":[{"name":"a","digest":"sha256:0a0a"},{"name":"b","digest":"sha256:0b0b"}]`
	done := func(fields string) string { return `{` + members + `,"completed":[{"name":"i1",` + fields + `}]}` }
	const okFields = `"exitCode":0,"restarts":0,"reason":"Completed","message":"","finishedAt":"2026-12-04T22:00:00Z"`
	fp = &forkParams{}
	stage = write(t, done(okFields))
	if err := readGroupExport(stage, &initSpec, fp); err != nil {
		t.Fatal(err)
	}
	if c := fp.completed["i1"]; c.run != filepath.Join(stage, "init-0") || c.exit.ExitCode == nil || *c.exit.ExitCode != 0 ||
		c.exit.Reason != "Completed" || !c.exit.At.Equal(time.Date(2026, 12, 4, 22, 0, 0, 0, time.UTC)) {
		t.Errorf("completed %+v", fp.completed)
	}
	future := time.Now().Add(72 * time.Hour).UTC().Format(time.RFC3339)
	for what, body := range map[string]string{
		"no completion":        `{` + members + `}`,
		"two completions":      `{` + members + `,"completed":[{"name":"i1",` + okFields + `},{"name":"i2",` + okFields + `}]}`,
		"another name":         `{` + members + `,"completed":[{"name":"../x",` + okFields + `}]}`,
		"no exit code":         done(`"restarts":0,"reason":"Completed","message":"","finishedAt":"2026-12-04T22:00:00Z"`),
		"exit code 1":          done(`"exitCode":1,"restarts":0,"reason":"Error","message":"","finishedAt":"2026-12-04T22:00:00Z"`),
		"negative restarts":    done(`"exitCode":0,"restarts":-1,"reason":"Completed","message":"","finishedAt":"2026-12-04T22:00:00Z"`),
		"huge restarts":        done(`"exitCode":0,"restarts":99999999999,"reason":"Completed","message":"","finishedAt":"2026-12-04T22:00:00Z"`),
		"reason not a word":    done(`"exitCode":0,"restarts":0,"reason":"Completed\u001b[2J","message":"","finishedAt":"2026-12-04T22:00:00Z"`),
		"long reason":          done(`"exitCode":0,"restarts":0,"reason":"C` + strings.Repeat("x", maxCompletedReason) + `","message":"","finishedAt":"2026-12-04T22:00:00Z"`),
		"long message":         done(`"exitCode":0,"restarts":0,"reason":"Completed","message":"` + strings.Repeat("m", maxCompletedMessage+1) + `","finishedAt":"2026-12-04T22:00:00Z"`),
		"control in message":   done(`"exitCode":0,"restarts":0,"reason":"Completed","message":"a\u0007b","finishedAt":"2026-12-04T22:00:00Z"`),
		"no finish time":       done(`"exitCode":0,"restarts":0,"reason":"Completed","message":""`),
		"finish in the future": done(`"exitCode":0,"restarts":0,"reason":"Completed","message":"","finishedAt":"` + future + `"`),
		"unknown field":        done(okFields + `,"pid":1`),
	} {
		if err := readGroupExport(write(t, body), &initSpec, &forkParams{}); !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("%s: %v, want refused", what, err)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}
	// Sidecars that had ended: their exits recorded (any exit code 0-255 or none, one of
	// the final reasons, bounded fields); a running sidecar has none, an ended one needs
	// no digest.
	ended := func(a, b string) string {
		return `{"members":[{"name":"a","digest":"sha256:0a0a"` + a + `},{"name":"b","digest":"sha256:0b0b"` + b + `}]}`
	}
	endedAt := func(fields string) string { return `,"ended":{` + fields + `,"finishedAt":"2026-12-04T22:00:00Z"}` }
	fp = &forkParams{}
	stage = write(t, `{"members":[{"name":"a","digest":"","ended":{"exitCode":137,"restarts":6,"reason":"RestartLimit","message":"main command killed by signal 9 (killed)\n","finishedAt":"2026-12-04T22:00:00Z"}},{"name":"b","digest":"sha256:0b0b"}]}`)
	if err := readGroupExport(stage, spec, fp); err != nil {
		t.Fatal(err)
	}
	if c, ok := fp.completed["a"]; !ok || fp.members["a"] != "" || c.run != filepath.Join(stage, "member-0") || c.exit.ExitCode == nil || *c.exit.ExitCode != 137 ||
		c.exit.Restarts != 6 || c.exit.Reason != "RestartLimit" || !c.exit.At.Equal(time.Date(2026, 12, 4, 22, 0, 0, 0, time.UTC)) || fp.members["b"] == "" {
		t.Errorf("ended %+v, members %v", fp.completed, fp.members)
	}
	for _, fields := range []string{`"exitCode":0,"restarts":0,"reason":"Completed","message":""`, `"exitCode":null,"restarts":0,"reason":"StartError","message":"no such file"`,
		`"exitCode":255,"restarts":1048576,"reason":"Error","message":""`, `"exitCode":0,"restarts":0,"reason":"Stopped","message":""`} {
		if err := readGroupExport(write(t, ended(endedAt(fields), "")), spec, &forkParams{}); err != nil {
			t.Errorf("%s: %v", fields, err)
		}
	}
	for what, body := range map[string]string{
		"exit code 256":        ended(endedAt(`"exitCode":256,"restarts":0,"reason":"Error","message":""`), ""),
		"negative exit code":   ended(endedAt(`"exitCode":-9,"restarts":0,"reason":"Error","message":""`), ""),
		"unknown reason":       ended(endedAt(`"exitCode":1,"restarts":0,"reason":"Pwned","message":""`), ""),
		"completed, code 1":    ended(endedAt(`"exitCode":1,"restarts":0,"reason":"Completed","message":""`), ""),
		"reason with escape":   ended(endedAt(`"exitCode":1,"restarts":0,"reason":"Error\u001b[2J","message":""`), ""),
		"long message":         ended(endedAt(`"exitCode":1,"restarts":0,"reason":"Error","message":"`+strings.Repeat("m", maxCompletedMessage+1)+`"`), ""),
		"control in message":   ended(endedAt(`"exitCode":1,"restarts":0,"reason":"Error","message":"a\u0007b"`), ""),
		"huge restarts":        ended(endedAt(`"exitCode":1,"restarts":1048577,"reason":"Error","message":""`), ""),
		"no finish time":       ended(`,"ended":{"exitCode":1,"restarts":0,"reason":"Error","message":""}`, ""),
		"finish in the future": ended(`,"ended":{"exitCode":1,"restarts":0,"reason":"Error","message":"","finishedAt":"`+future+`"}`, ""),
		"unknown field":        ended(endedAt(`"exitCode":1,"restarts":0,"reason":"Error","message":"","pid":1`), ""),
		"bad digest":           ended(`,"digest":"../x"`+endedAt(`"exitCode":1,"restarts":0,"reason":"Error","message":""`), ""),
		"running, no digest":   `{"members":[{"name":"a","digest":""},{"name":"b","digest":"sha256:0b0b"}]}`,
		"unknown container":    `{"members":[{"name":"a","digest":"sha256:0a0a"},{"name":"c","digest":"sha256:0b0b"` + endedAt(`"exitCode":1,"restarts":0,"reason":"Error","message":""`) + `}]}`,
	} {
		if err := readGroupExport(write(t, body), spec, &forkParams{}); !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("ended sidecar, %s: %v, want refused", what, err)
		} else {
			t.Logf("ended sidecar, %s: %v", what, err)
		}
	}
	// A link in place of group.json (to a file the host reads) is not followed.
	stage = t.TempDir()
	target := filepath.Join(t.TempDir(), "host.json")
	if err := os.WriteFile(target, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(stage, partGroup), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(stage, partGroup, fileGroupExport)); err != nil {
		t.Fatal(err)
	}
	if err := readGroupExport(stage, spec, &forkParams{}); err == nil {
		t.Error("a symlinked group.json was followed")
	}
}

// FuzzEndedExit: whatever a sidecar's recorded exit holds (its agent's status, which the
// sandbox can write, fed it), the exit a fork records of it (endedExit) is one an
// import accepts (endedInvalid), and one already acceptable is kept as it is.
func FuzzEndedExit(f *testing.F) {
	f.Add(int32(7), true, 1, "RestartLimit", "", int64(1764885600))
	f.Add(int32(0), true, 0, "Completed", "done", int64(1764885600))
	f.Add(int32(300), true, -4, "Pwned\x1b", "a\x07\xff"+strings.Repeat("é", 600), int64(-1))
	f.Add(int32(0), false, 99999999, "", "", int64(1<<40))
	f.Fuzz(func(t *testing.T, code int32, hasCode bool, restarts int, reason, msg string, at int64) {
		now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
		ex := runtime.Exit{Restarts: restarts, Reason: reason, Message: msg, At: time.Unix(at, 0)}
		if hasCode {
			ex.ExitCode = &code
		}
		got := endedExit(ex, now)
		ge := exportExit(got)
		if why := endedInvalid(&ge, now); why != "" {
			t.Fatalf("endedExit(%+v) = %+v: refused: %s", ex, got, why)
		}
		if endedInvalid(&groupExportExit{ExitCode: ex.ExitCode, Restarts: ex.Restarts, Reason: ex.Reason, Message: ex.Message, FinishedAt: ex.At.UTC()}, now) == "" &&
			!reflect.DeepEqual(exportExit(got), exportExit(ex)) {
			t.Fatalf("endedExit(%+v) = %+v: an acceptable exit changed", ex, got)
		}
	})
}
