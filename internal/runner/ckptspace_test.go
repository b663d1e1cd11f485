package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
)

// TestPauseRefusedCheckpointSpaceLocal: the local backend's checkpoint space refusals
// (over --checkpoint-quota-bytes, under --checkpoint-min-free-bytes), as its Pause
// returns them, reach the API as RESOURCE_EXHAUSTED CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED
// without RetryInfo, the message naming the limit, and the sandbox stays RUNNING; once
// the backend admits the checkpoint the pause succeeds. A fork refused so lists each fork
// failed with the same reason.
func TestPauseRefusedCheckpointSpaceLocal(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	for _, tc := range []struct {
		refusal error
		flag    string
	}{
		{local.ErrCheckpointQuota, "--checkpoint-quota-bytes"},
		{local.ErrCheckpointMinFree, "--checkpoint-min-free-bytes"},
	} {
		be.mu.Lock()
		be.refuse = fmt.Errorf("pause %s: %w", sb.ID, tc.refusal) // as local.Backend.Pause wraps it
		be.mu.Unlock()
		_, err := l.Pause(ctx, sb.ID, PauseOptions{})
		ae := APIError(sb.ID, err, SpecField)
		var ce *connect.Error
		if !errors.As(ae, &ce) {
			t.Fatalf("%s: %v is no API error", tc.flag, ae)
		}
		if apierr.Reason(ae) != apierr.CheckpointSpaceExhausted || ce.Code() != connect.CodeResourceExhausted {
			t.Errorf("%s: %v %s, want RESOURCE_EXHAUSTED %s", tc.flag, ce.Code(), apierr.Reason(ae), apierr.CheckpointSpaceExhausted)
		}
		if ri := apierr.RetryInfo(ae); ri != nil {
			t.Errorf("%s: RetryInfo %v", tc.flag, ri)
		}
		if !strings.Contains(ce.Message(), tc.flag) {
			t.Errorf("%s: message %q does not name the limit", tc.flag, ce.Message())
		}
		if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
			t.Errorf("%s: the sandbox is %s, want RUNNING", tc.flag, got.State)
		}
	}
	be.mu.Lock()
	be.refuse = nil
	be.mu.Unlock()
	// A fork refused so: each fork failed with the refusal, mapped the same way.
	refusal := fmt.Errorf("fork %s: %w", sb.ID, local.ErrCheckpointQuota) // as local.Backend.Fork wraps it
	be.mu.Lock()
	be.forkFail["cks-f1"], be.forkFail["cks-f2"] = refusal, refusal
	be.mu.Unlock()
	res, err := l.Fork(ctx, sb.ID, []ForkTarget{{ID: "cks-f1"}, {ID: "cks-f2"}})
	if err != nil || len(res) != 2 {
		t.Fatalf("fork: %d results, %v", len(res), err)
	}
	for _, r := range res {
		ae := APIError(r.Sandbox.ID, r.Err, "")
		if apierr.Reason(ae) != apierr.CheckpointSpaceExhausted || !strings.Contains(ae.Error(), "--checkpoint-quota-bytes") {
			t.Errorf("fork %s: %v (%s)", r.Sandbox.ID, ae, apierr.Reason(ae))
		}
	}
	if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
		t.Errorf("after the refused fork: the source is %s, want RUNNING", got.State)
	}
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{}); err != nil {
		t.Fatal(err)
	}
}
