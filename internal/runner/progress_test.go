package runner

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestWatchProgressEndsAtRunning: a progress watch sends RUNNING and ends as soon as the
// sandbox runs (woken by the runner's change of its record), not at its next tick: with
// an hour between ticks it still ends (`sbx run` waited up to 250 ms for it).
func TestWatchProgressEndsAtRunning(t *testing.T) {
	f := runtimetest.NewFake()
	release := make(chan struct{})
	f.OnCreate = releaseCreate(release)
	r := newQuietRunner(t, f)
	r.progressInterval = time.Hour
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan StartProgress, 1)
	done := make(chan error, 1)
	var last StartProgress
	go func() {
		done <- r.WatchProgress(context.Background(), sb.ID, func(p StartProgress) error {
			select {
			case first <- p:
			default:
			}
			last = p
			return nil
		})
	}()
	if p := <-first; p.State != StateCreating {
		t.Fatalf("first update: %v, want CREATING", p.State)
	}
	close(release)
	select {
	case err := <-done:
		if err != nil || last.State != StateRunning {
			t.Errorf("watch ended: %v, last update %v, want RUNNING", err, last.State)
		}
	case <-time.After(60 * time.Second): // a bound: without the wake it ends after an hour
		t.Fatal("the watch did not end when the sandbox ran")
	}
}
