package local

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPauseCheckpointSpace: with the checkpoint quota too small for a gVisor sandbox's
// memory (16 MiB written into its root filesystem, held in runsc's overlay memory file),
// a pause releasing resources and a fork are refused ErrCheckpointSpaceExhausted naming
// the limit, before the sandbox is touched: it runs on (counter, exec), nothing of a
// checkpoint is left, no fork dir. Under a quota that fits, the pause succeeds and its
// image is counted: a second sandbox whose estimate alone fits is refused while the
// first's image is held, and admitted once it is resumed (the image removed). A minimum
// of free space larger than the disk refuses too.
func TestPauseCheckpointSpace(t *testing.T) {
	e := newEnvWith(t, func(c *Config) { c.CheckpointQuotaBytes = 8 << 20 })
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	ctx := context.Background()
	const a, b = "cks-a", "cks-b"
	e.create(runtime.Spec{ID: a, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}})
	e.create(runtime.Spec{ID: b, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	sh(t, e.b, a, "dd if=/dev/urandom of=/tmp/blob bs=1M count=16 2>/dev/null; sync")
	c1 := waitCount(t, e.b, a, 2)
	refused := func(err error, limit string) {
		t.Helper()
		if !errors.Is(err, runtime.ErrCheckpointSpaceExhausted) || !strings.Contains(err.Error(), limit) {
			t.Fatalf("got %v, want ErrCheckpointSpaceExhausted naming %s", err, limit)
		}
	}
	untouched := func(id string) {
		t.Helper()
		if e.b.isPaused(id) {
			t.Errorf("%s paused after a refused checkpoint", id)
		}
		ents, _ := os.ReadDir(e.b.dir(id))
		for _, ent := range ents {
			if strings.HasPrefix(ent.Name(), dirCheckpoint) || strings.HasPrefix(ent.Name(), "fork-") || ent.Name() == filePaused {
				t.Errorf("left after a refused checkpoint of %s: %s", id, ent.Name())
			}
		}
		if got := sh(t, e.b, id, "echo ok"); got != "ok" {
			t.Errorf("exec in %s after a refused checkpoint: %q", id, got)
		}
		if _, in := e.b.CheckpointBytes(); in != 0 {
			t.Errorf("%d bytes still reserved after a refusal", in)
		}
	}
	if est := e.b.checkpointEstimate(e.b.sandboxes[a], false); est < 16<<20 {
		t.Fatalf("estimate of a sandbox holding 16 MiB: %d", est)
	}
	_, err := e.b.Pause(ctx, a, true)
	refused(err, "--checkpoint-quota-bytes")
	forks := []*runtime.Spec{
		{ID: "cks-f1", RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}},
		{ID: "cks-f2", RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}},
	}
	_, errs := e.b.Fork(ctx, a, forks)
	for i, err := range errs {
		refused(err, "--checkpoint-quota-bytes")
		if _, serr := os.Stat(e.b.dir(forks[i].ID)); !os.IsNotExist(serr) {
			t.Errorf("refused fork %s left its dir (%v)", forks[i].ID, serr)
		}
	}
	untouched(a)
	waitCount(t, e.b, a, c1+3)

	// A quota that fits: the pause succeeds, its image is counted.
	e.b.ckpt.QuotaBytes = 4 << 30
	pi, err := e.b.Pause(ctx, a, true)
	if err != nil {
		t.Fatal(err)
	}
	if img, in := e.b.CheckpointBytes(); img != pi.CheckpointBytes || img < 16<<20 || in != 0 {
		t.Fatalf("after the pause: images %d in flight %d, checkpoint %d", img, in, pi.CheckpointBytes)
	}
	estB := e.b.checkpointEstimate(e.b.sandboxes[b], false)
	e.b.ckpt.QuotaBytes = estB + pi.CheckpointBytes/2 // b alone fits, not beside a's image
	_, err = e.b.Pause(ctx, b, true)
	refused(err, "--checkpoint-quota-bytes")
	untouched(b)
	if _, err := e.b.Resume(ctx, a); err != nil {
		t.Fatal(err)
	}
	if img, _ := e.b.CheckpointBytes(); img != 0 {
		t.Errorf("images after the resume: %d", img)
	}
	if _, err := e.b.Pause(ctx, b, true); err != nil {
		t.Fatalf("pause of b once a's image is gone: %v", err)
	}
	if _, err := e.b.Resume(ctx, b); err != nil {
		t.Fatal(err)
	}
	// Free space.
	e.b.ckpt.QuotaBytes, e.b.ckpt.MinFreeBytes = 0, 1<<62
	_, err = e.b.Pause(ctx, a, true)
	refused(err, "--checkpoint-min-free-bytes")
	untouched(a)
	c2 := count(t, e.b, a)
	waitCount(t, e.b, a, c2+2)
}
