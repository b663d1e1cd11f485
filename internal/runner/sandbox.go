package runner

import (
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// State is a sandbox's lifecycle state. The values match coreweave.sandbox.v1.State so the
// gateway can pass them through unchanged.
type State int

const (
	StateUnspecified State = 0
	StateCreating    State = 1
	StateRunning     State = 2
	StateCompleted   State = 3 // the main command exited 0 on its own
	StateFailed      State = 4 // could not start, restart limit, lifetime exceeded, vanished
	StateTerminating State = 5 // a delete is in progress
	StateTerminated  State = 6 // stopped by a delete
	StatePending     State = 7 // accepted, not yet started
)

var stateNames = map[State]string{
	StateUnspecified: "UNSPECIFIED",
	StateCreating:    "CREATING",
	StateRunning:     "RUNNING",
	StateCompleted:   "COMPLETED",
	StateFailed:      "FAILED",
	StateTerminating: "TERMINATING",
	StateTerminated:  "TERMINATED",
	StatePending:     "PENDING",
	StatePaused:      "PAUSED",
}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return "UNKNOWN"
}

// Terminal reports whether the sandbox will never run again.
func (s State) Terminal() bool {
	return s == StateCompleted || s == StateFailed || s == StateTerminated
}

// Reasons for a sandbox's state, as reported in Sandbox.Reason.
const (
	ReasonImagePullFailed  = runtime.FailureImagePull
	ReasonStartError       = runtime.FailureStart
	ReasonRestartLimit     = "RestartLimit"
	ReasonOOMKilled        = "OOMKilled"
	ReasonLifetimeExceeded = "LifetimeExceeded"
	ReasonVanished         = "Vanished"
	ReasonDeleted          = "Deleted"
	ReasonCompleted        = "Completed"
	ReasonBackendError     = runtime.FailureBackend
	// ReasonForkFailed: a fork (ForkTarget) that the backend could not make.
	ReasonForkFailed = "ForkFailed"
	// ReasonCheckpointLost: a paused sandbox whose checkpoint is unusable, ended.
	ReasonCheckpointLost = "CheckpointLost"
)

// Sandbox is a snapshot of what the runner knows about one sandbox.
type Sandbox struct {
	ID       string
	Spec     runtime.Spec
	State    State
	Reason   string
	Message  string
	ExitCode *int32 // the main command's last exit code, when observed (0 is real)
	Restarts int
	// OOMKills counts processes the memory limit killed (main command or exec'd).
	OOMKills int

	CreatedAt time.Time
	StartedAt time.Time // zero until RUNNING
	EndedAt   time.Time // zero until terminal
	Lifetime  time.Duration
	Deadline  time.Time

	IP           string
	RuntimeClass string
	ImageDigest  string

	// Pause says how a PAUSED sandbox is paused; nil otherwise.
	Pause *PauseStatus

	// Containers are the sandbox's containers as its backend last reported them (init
	// containers first, then the primary and the sidecars); nil for a single-container
	// sandbox, whose state is the sandbox's own.
	Containers []runtime.ContainerStatus

	// Usage is what the sandbox uses now: set by Get for a RUNNING sandbox whose backend
	// can tell (runtime.UsageReader), nil otherwise.
	Usage *Usage
}

// Usage is a running sandbox's use of CPU and memory.
type Usage struct {
	// CPUMillicores is the CPU used, averaged over the window since the previous sample
	// (at least usageWindow) or, at the first, since the sandbox started.
	CPUMillicores int64
	runtime.Usage
}
