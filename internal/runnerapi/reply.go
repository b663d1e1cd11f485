package runnerapi

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// A runner's reply is not trusted (an organization runs its own runners): what the
// gateway takes from it is checked here, and a reply that cannot be right fails the one
// call as the runner's fault (badReply), never the gateway.

// Bounds of what a runner's reply may hold.
const (
	// maxReplyText bounds a reason or message (of a sandbox, a container, a job).
	maxReplyText = 64 << 10
	// maxReplyContainers bounds a sandbox's container statuses.
	maxReplyContainers = runtime.MaxContainers
	// maxIDLen bounds an ID a runner answers (a sandbox's: runtime.ValidID).
	maxIDLen = 63
	// maxReplyShort bounds a short string of a reply: an address, a runtime class, an
	// image digest, a container's name and state, a fork error's code and reason, a snapshot's
	// digest. The gateway keeps them with the sandbox (in memory and in its store) and
	// shows them to users: counts alone bound the elements, not their bytes.
	maxReplyShort = 1 << 10
)

// clipText and clipShort are what a runner fills into its reply from a backend's or an
// error's text (a sandbox's or container's reason and message, a fork error, a snapshot
// job), clipped to the bounds the gateway checks that reply against (on a character
// boundary, as valid UTF-8): otherwise one long runsc or kubelet message would make the
// gateway refuse the whole reply (a Fork's: every target's result).
func clipText(s string) string  { return textclip.Clip(s, maxReplyText) }
func clipShort(s string) string { return textclip.Clip(s, maxReplyShort) }

// MaxListedSandboxes bounds the sandboxes of a runner's List reply.
const MaxListedSandboxes = 1 << 16

// badReply is the error of a call whose reply from runner runnerID cannot be right
// (runner.BadReply), the message saying what was wrong.
func badReply(runnerID, format string, args ...any) error {
	return runner.BadReply(runnerID, fmt.Sprintf(format, args...))
}

// checkTime: an unset timestamp or one a gateway can keep (RFC 3339: years 1 to 9999).
func checkTime(what string, t *timestamppb.Timestamp) error {
	if t == nil {
		return nil
	}
	if err := t.CheckValid(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if y := t.AsTime().Year(); y < 1 || y > 9999 {
		return fmt.Errorf("%s: year %d", what, y)
	}
	return nil
}

// checkDuration: an unset duration or a valid one of at least 0.
func checkDuration(what string, d *durationpb.Duration) error {
	if d == nil {
		return nil
	}
	if err := d.CheckValid(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if d.AsDuration() < 0 {
		return fmt.Errorf("%s: negative (%v)", what, d.AsDuration())
	}
	return nil
}

func checkText(what, s string) error {
	if len(s) > maxReplyText {
		return fmt.Errorf("%s: %d bytes, at most %d", what, len(s), maxReplyText)
	}
	return nil
}

func checkShort(what, s string) error {
	if len(s) > maxReplyShort {
		return fmt.Errorf("%s: %d bytes, at most %d", what, len(s), maxReplyShort)
	}
	return nil
}

func checkCount(what string, n int64) error {
	if n < 0 {
		return fmt.Errorf("%s: negative (%d)", what, n)
	}
	return nil
}

// checkSandbox checks a sandbox a runner answered: want is the ID it was asked about
// ("" = any valid one, or none); an answer without an ID is about want.
func checkSandbox(runnerID, want string, p *runnerv1.Sandbox) error {
	if err := sandboxProblem(want, p); err != nil {
		return badReply(runnerID, "sandbox %q: %v", clipID(p.GetId()), err)
	}
	return nil
}

func sandboxProblem(want string, p *runnerv1.Sandbox) error {
	id := p.GetId()
	switch {
	case want != "" && id != "" && id != want:
		return fmt.Errorf("asked about sandbox %s", want)
	case id != "" && !runtime.ValidID(id, maxIDLen):
		return fmt.Errorf("not a sandbox ID")
	}
	if _, ok := runnerv1.State_name[int32(p.GetState())]; !ok {
		return fmt.Errorf("unknown state %d", p.GetState())
	}
	for _, c := range []struct {
		what string
		n    int64
	}{{"restarts", int64(p.GetRestarts())}, {"oom_kills", int64(p.GetOomKills())},
		{"pause.checkpoint_bytes", p.GetPause().GetCheckpointBytes()},
		{"usage.cpu_millicores", p.GetUsage().GetCpuMillicores()}, {"usage.cpu_usage_usec", p.GetUsage().GetCpuUsageUsec()},
		{"usage.memory_bytes", p.GetUsage().GetMemoryBytes()}, {"usage.memory_peak_bytes", p.GetUsage().GetMemoryPeakBytes()},
	} {
		if err := checkCount(c.what, c.n); err != nil {
			return err
		}
	}
	for _, t := range []struct {
		what string
		t    *timestamppb.Timestamp
	}{{"created_at", p.GetCreatedAt()}, {"started_at", p.GetStartedAt()}, {"ended_at", p.GetEndedAt()},
		{"deadline", p.GetDeadline()}, {"pause.paused_at", p.GetPause().GetPausedAt()}} {
		if err := checkTime(t.what, t.t); err != nil {
			return err
		}
	}
	if err := checkDuration("lifetime", p.GetLifetime()); err != nil {
		return err
	}
	if err := checkText("reason", p.GetReason()); err != nil {
		return err
	}
	if err := checkText("message", p.GetMessage()); err != nil {
		return err
	}
	for _, f := range []struct{ what, s string }{{"ip", p.GetIp()}, {"runtime_class", p.GetRuntimeClass()}, {"image_digest", p.GetImageDigest()}} {
		if err := checkShort(f.what, f.s); err != nil {
			return err
		}
	}
	cs := p.GetContainers()
	if len(cs) > maxReplyContainers {
		return fmt.Errorf("%d container statuses, at most %d", len(cs), maxReplyContainers)
	}
	for i, c := range cs {
		if err := checkShort(fmt.Sprintf("containers[%d].name", i), c.GetName()); err != nil {
			return err
		}
		if err := checkShort(fmt.Sprintf("containers[%d].state", i), c.GetState()); err != nil {
			return err
		}
		if err := checkCount(fmt.Sprintf("containers[%d].restarts", i), int64(c.GetRestarts())); err != nil {
			return err
		}
		if err := checkText(fmt.Sprintf("containers[%d].reason", i), c.GetReason()); err != nil {
			return err
		}
		if err := checkText(fmt.Sprintf("containers[%d].message", i), c.GetMessage()); err != nil {
			return err
		}
	}
	return nil
}

// clipID is a runner's ID for a message: at most maxIDLen bytes of it.
func clipID(id string) string {
	if len(id) > maxIDLen {
		return id[:maxIDLen] + "…"
	}
	return id
}

// checkJob checks a snapshot job a runner answered for snapshot want ("" = any).
func checkJob(runnerID, want string, p *runnerv1.SnapshotJob) error {
	err := func() error {
		if want != "" && p.GetSnapshotId() != want {
			return fmt.Errorf("asked about snapshot %s", want)
		}
		for _, c := range []struct {
			what string
			n    int64
		}{{"size_bytes", p.GetSizeBytes()}, {"content_bytes", p.GetContentBytes()}} {
			if err := checkCount(c.what, c.n); err != nil {
				return err
			}
		}
		if err := checkTime("complete_time", p.GetCompleteTime()); err != nil {
			return err
		}
		if err := checkDuration("pause", p.GetPause()); err != nil {
			return err
		}
		if err := checkText("reason", p.GetReason()); err != nil {
			return err
		}
		for _, f := range []struct{ what, s string }{{"sandbox_id", p.GetSandboxId()}, {"volume", p.GetVolume()}, {"digest", p.GetDigest()}} {
			if err := checkShort(f.what, f.s); err != nil {
				return err
			}
		}
		return checkText("message", p.GetMessage())
	}()
	if err != nil {
		return badReply(runnerID, "snapshot job %q: %v", clipID(p.GetSnapshotId()), err)
	}
	return nil
}

// checkCapacity checks a runner's capacity: no negative amount, nothing used beyond
// what there is counted as less.
func checkCapacity(runnerID string, p *runnerv1.CapacityResponse) error {
	for _, c := range []struct {
		what string
		n    int64
	}{{"milli_cpu", p.GetMilliCpu()}, {"memory_bytes", p.GetMemoryBytes()}, {"used_milli_cpu", p.GetUsedMilliCpu()},
		{"used_memory_bytes", p.GetUsedMemoryBytes()}, {"running", int64(p.GetRunning())}, {"gpus", p.GetGpus()},
		{"used_gpus", p.GetUsedGpus()}, {"max_sandboxes", int64(p.GetMaxSandboxes())}, {"edge_port", int64(p.GetEdgePort())},
		{"paused", int64(p.GetPaused())}, {"default_resources.milli_cpu", p.GetDefaultResources().GetMilliCpu()},
		{"default_resources.memory_bytes", p.GetDefaultResources().GetMemoryBytes()},
	} {
		if err := checkCount(c.what, c.n); err != nil {
			return badReply(runnerID, "capacity: %v", err)
		}
	}
	if p.GetEdgePort() > 65535 {
		return badReply(runnerID, "capacity: edge_port %d", p.GetEdgePort())
	}
	if o := p.GetCpuOvercommit(); math.IsNaN(o) || math.IsInf(o, 0) || o < 0 {
		return badReply(runnerID, "capacity: cpu_overcommit %v", o)
	}
	if err := checkTime("connected_at", p.GetConnectedAt()); err != nil {
		return badReply(runnerID, "capacity: %v", err)
	}
	return nil
}

// checkForkError checks the error of one fork a runner answered.
func checkForkError(runnerID, target string, p *runnerv1.ForkError) error {
	err := checkShort("code", p.GetCode())
	if err == nil {
		err = checkShort("reason", p.GetReason())
	}
	if err == nil {
		err = checkText("message", p.GetMessage())
	}
	if err != nil {
		return badReply(runnerID, "fork %s: error %v", target, err)
	}
	return nil
}
