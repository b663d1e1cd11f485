package agent

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// A final status the host reads back from a file the sandbox can write (the local
// backend's status.json, the gate's copy of it and a sidecar's termination message on
// Kubernetes) is the sandbox's own word about its own container: the workload can write
// that file as well as its agent. BoundFinal holds such a status to what an agent could
// say, so it decides nothing the sandbox could not have caused itself.

// MaxStatusText bounds text a sandbox can write that is reported as it is (an agent's
// status message, a container's termination message).
const MaxStatusText = 1024

// StatusText is text the sandbox could write, fit to report: at most MaxStatusText bytes
// of valid UTF-8, and "" unless all of it is printable.
func StatusText(s string) string {
	if s = textclip.Clip(s, MaxStatusText); !textclip.AllPrintable(s) {
		return ""
	}
	return s
}

// reasons are the reasons an agent gives a final status: the only ones a status read
// from a file the sandbox can write may give. Every other (OOMKilled, Killed, Vanished,
// Evicted, ...) is the platform's to say.
var reasons = map[string]bool{
	ReasonCompleted: true, ReasonError: true, ReasonRestartLimit: true,
	ReasonStartError: true, ReasonStopped: true,
}

// IsReason reports whether r is a reason an agent gives.
func IsReason(r string) bool { return reasons[r] }

// FinalState reports whether an agent's main command has ended for good.
func FinalState(st *agentv1.StatusResponse) bool {
	switch st.GetState() {
	case agentv1.MainState_MAIN_STATE_COMPLETED, agentv1.MainState_MAIN_STATE_FAILED, agentv1.MainState_MAIN_STATE_STOPPED:
		return true
	}
	return false
}

// BoundRestarts is a restart count the sandbox reported (n), held to [0, restartLimit]:
// its agent restarts a main command at most restartLimit times.
func BoundRestarts(n int32, restartLimit int) int32 {
	return min(max(n, 0), int32(min(max(restartLimit, 0), math.MaxInt32)))
}

// BoundFinal is st (read from a file the sandbox can write) held to what an agent could
// say: a final state (else nil), a known reason (else Error), restarts within
// [0, restartLimit], a bounded printable message (StatusText), no pid, and times within
// [from, to] (else none; a zero from bounds nothing below). st is modified in place.
func BoundFinal(st *agentv1.StatusResponse, restartLimit int, from, to time.Time) *agentv1.StatusResponse {
	if !FinalState(st) {
		return nil
	}
	if !reasons[st.GetReason()] {
		st.Reason = ReasonError
	}
	st.RestartCount = BoundRestarts(st.GetRestartCount(), restartLimit)
	st.Message = StatusText(st.GetMessage())
	st.Pid = 0
	within := func(ts *timestamppb.Timestamp) *timestamppb.Timestamp {
		if ts == nil || !ts.IsValid() {
			return nil
		}
		if at := ts.AsTime(); !from.IsZero() && at.Before(from) || at.After(to) {
			return nil
		}
		return ts
	}
	st.StartedAt, st.FinishedAt = within(st.StartedAt), within(st.FinishedAt)
	return st
}
