package agent

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// TestStopRPC: Stop ends a main command that exits on SIGTERM (STOPPED, no restart), and
// kills one that ignores SIGTERM once the grace has run out; the agent ends either way.
func TestStopRPC(t *testing.T) {
	for _, tc := range []struct {
		name  string
		argv  []string
		grace time.Duration
		min   time.Duration
	}{
		{"exits on SIGTERM", []string{"/bin/sh", "-c", "trap 'exit 3' TERM; while :; do sleep 0.05; done"}, 10 * time.Second, 0},
		{"ignores SIGTERM", []string{"/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"}, 700 * time.Millisecond, 700 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startAgent(t, &agentconfig.Config{Argv: tc.argv, RestartLimit: 5})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for {
				st, err := h.client.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
				if err == nil && st.Msg.GetState() == agentv1.MainState_MAIN_STATE_RUNNING {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("not running: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // the trap is set
			start := time.Now()
			if _, err := h.client.Stop(ctx, connect.NewRequest(&agentv1.StopRequest{Grace: durationpb.New(tc.grace)})); err != nil {
				t.Fatal(err)
			}
			h.wait(t)
			took := time.Since(start)
			if took < tc.min || took > tc.min+5*time.Second {
				t.Errorf("the agent ended after %s, want %s plus a little", took, tc.min)
			}
			if st := h.statusFile(t); st.GetState() != agentv1.MainState_MAIN_STATE_STOPPED || st.GetRestartCount() != 0 {
				t.Errorf("final status %v, want STOPPED without restarts", st)
			}
		})
	}
	t.Run("negative grace", func(t *testing.T) {
		h := startAgent(t, &agentconfig.Config{Argv: []string{"/bin/sh", "-c", "sleep 30"}})
		_, err := h.client.Stop(context.Background(), connect.NewRequest(&agentv1.StopRequest{Grace: durationpb.New(-time.Second)}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("Stop with a negative grace: %v, want INVALID_ARGUMENT", err)
		}
	})
}
