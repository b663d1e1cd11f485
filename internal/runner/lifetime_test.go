package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestUpdateLifetimeExtends: an extended sandbox is still running after its first
// deadline, and a restarted runner keeps the new deadline.
func TestUpdateLifetimeExtends(t *testing.T) {
	h := newHarness(t, runtimetest.NewFake())
	h.start(nil)
	create(300 * time.Millisecond)(h)
	h.await(StateRunning)
	sb, err := h.runner().UpdateLifetime(context.Background(), h.id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Lifetime != time.Hour || !sb.Deadline.Equal(sb.CreatedAt.Add(time.Hour)) {
		t.Fatalf("updated: lifetime %s deadline %s (created %s)", sb.Lifetime, sb.Deadline, sb.CreatedAt)
	}
	time.Sleep(600 * time.Millisecond) // past the old deadline
	got, err := h.runner().Get(h.id)
	if err != nil || got.State != StateRunning {
		t.Fatalf("after the old deadline: %v %v, want RUNNING", got.State, err)
	}
	h.closeRunner()
	h.start(nil)
	got, err = h.runner().Get(h.id)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateRunning || got.Lifetime != time.Hour || !got.Deadline.Equal(sb.Deadline) {
		t.Errorf("after a restart: %s lifetime %s deadline %s, want RUNNING 1h %s", got.State, got.Lifetime, got.Deadline, sb.Deadline)
	}
}

// TestUpdateLifetimeIntoThePastStops: a lifetime already over stops the sandbox as its
// expiry does; a stopped sandbox's lifetime cannot change.
func TestUpdateLifetimeIntoThePastStops(t *testing.T) {
	h := newHarness(t, runtimetest.NewFake())
	h.start(nil)
	create(time.Hour)(h)
	h.await(StateRunning)
	if _, err := h.runner().UpdateLifetime(context.Background(), h.id, time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	h.await(StateCompleted)
	sb, _ := h.runner().Get(h.id)
	if sb.Reason != ReasonLifetimeExceeded {
		t.Errorf("reason %q, want %s", sb.Reason, ReasonLifetimeExceeded)
	}
	if _, err := h.runner().UpdateLifetime(context.Background(), h.id, time.Hour); !errors.Is(err, ErrNotRunning) {
		t.Errorf("update of an ended sandbox: %v, want ErrNotRunning", err)
	}
}

func TestUpdateLifetimeRefusals(t *testing.T) {
	h := newHarness(t, runtimetest.NewFake())
	h.start(nil)
	create(time.Hour)(h)
	h.await(StateRunning)
	r := h.runner()
	var verr *ValidationError
	for _, d := range []time.Duration{0, -time.Second, MaxLifetime + time.Second} {
		if _, err := r.UpdateLifetime(context.Background(), h.id, d); !errors.As(err, &verr) {
			t.Errorf("lifetime %s: %v, want a ValidationError", d, err)
		}
	}
	if _, err := r.UpdateLifetime(context.Background(), "nope", time.Hour); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("unknown sandbox: %v, want not found", err)
	}
}
