package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Errors of pausing (APIError maps them: ErrPaused and ErrAlreadyPaused are
// FAILED_PRECONDITION CWSANDBOX_SANDBOX_NOT_RUNNING with metadata state PAUSED,
// ErrCannotCheckpoint FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED).
var (
	// ErrPaused: the sandbox is paused and does not resume by itself (AutoResume off).
	// An ErrNotRunning.
	ErrPaused = fmt.Errorf("%w: the sandbox is paused (resume it first)", ErrNotRunning)
	// ErrAlreadyPaused: Pause of a PAUSED sandbox. An ErrNotRunning.
	ErrAlreadyPaused = fmt.Errorf("%w: the sandbox is already paused", ErrNotRunning)
	// ErrCannotCheckpoint: the sandbox's runtime class cannot be checkpointed on this
	// runner (a pause releasing resources, a fork); wrapped with what can.
	ErrCannotCheckpoint = errors.New("cannot checkpoint")
)

// StatePaused is a paused sandbox (coreweave.sandbox.v1.STATE_PAUSED): see PauseHandle.
const StatePaused State = 8

// PauseHandle is implemented by Handles whose runner can pause, resume and fork sandboxes
// (the local Handle and runnerapi.Client); the gateway refuses PauseSandbox, ResumeSandbox
// and ForkSandbox on others (FAILED_PRECONDITION naming what is missing).
//
// A paused sandbox keeps its ID, address, endpoints, lifetime and scratch volumes. It is
// frozen (every process stopped in place by the cgroup freezer: memory kept and still
// counted in the runner's capacity; Pause.Released false) or checkpointed (its processes'
// state saved on the runner's disk and its processes ended: CPU and memory released and
// no longer counted; Pause.Released true). Which one is PauseOptions.Release's choice
// within what the sandbox's runtime class can do (runtime.PauseSupport).
//
// While paused, exec, files and endpoint traffic (Runner.Agent, the edge) resume the
// sandbox first when Pause.AutoResume is set, and answer ErrPaused otherwise (the API's
// FAILED_PRECONDITION CWSANDBOX_SANDBOX_NOT_RUNNING). Logs of a paused sandbox are served
// from what its agent wrote, without resuming it. Delete of a paused sandbox ends it
// (TERMINATED, Deleted) without resuming it. Whether the lifetime counts while paused is
// the sandbox's Pause.LifetimeHeld (from the runner policy's pause settings, resolved
// into the spec's Meta at create: runtime.MetaPauseLifetime, MetaAutoResume,
// MetaIdlePause).
type PauseHandle interface {
	Handle
	// Pause pauses a RUNNING sandbox and returns it PAUSED. Errors: runtime.ErrNotFound;
	// ErrNotRunning (not RUNNING: creating, terminating, ended — also already PAUSED,
	// which is ErrAlreadyPaused); ErrCannotCheckpoint (Release asked but the runtime
	// class cannot: its message names the runtime class that can).
	Pause(ctx context.Context, id string, opts PauseOptions) (Sandbox, error)
	// Resume continues a PAUSED sandbox and returns it RUNNING, once its agent answers.
	// Resuming a RUNNING sandbox is a no-op that returns it (idempotent); an ended one is
	// ErrNotRunning.
	Resume(ctx context.Context, id string) (Sandbox, error)
	// Fork makes len(targets) new sandboxes from RUNNING or PAUSED sandbox id, each a copy
	// of its memory, processes and files with its own ID, address and endpoints; the
	// source keeps its state (a running source pauses only for its checkpoint). Each
	// result is the new sandbox (RUNNING) or the error of that one fork. Errors of the
	// whole call: runtime.ErrNotFound, ErrNotRunning, ErrCannotCheckpoint. (Whether the
	// runner has room for them is the caller's placement's business, as for Create.)
	Fork(ctx context.Context, id string, targets []ForkTarget) ([]ForkResult, error)
}

// PauseOptions are the choices of one Pause.
type PauseOptions struct {
	// Release: nil = checkpoint where the runtime class can, else freeze; true =
	// checkpoint or refuse (ErrCannotCheckpoint); false = freeze.
	Release *bool
	// AutoResume: exec, files and endpoint traffic resume the sandbox (default true at
	// the API).
	AutoResume bool
}

// PauseStatus is how a paused sandbox is paused (Sandbox.Pause; nil unless PAUSED).
type PauseStatus struct {
	Released   bool // checkpointed: CPU and memory released; false: frozen, memory kept
	AutoResume bool
	// LifetimeHeld: the lifetime does not count while paused (the deadline moves on by
	// the time spent paused, at resume).
	LifetimeHeld    bool
	PausedAt        time.Time
	CheckpointBytes int64 // the checkpoint's size on the runner's disk; 0 when frozen
}

// ForkTarget is one sandbox a Fork makes.
type ForkTarget struct {
	ID string // chosen by the caller (the gateway), like a Create's
	// Meta replaces the source's bookkeeping (runtime.Meta*: organization, creation
	// time, user, …) for the new sandbox.
	Meta map[string]string
	// ShareTokenHash is the new sandbox's endpoint share token hash ("" = none).
	ShareTokenHash string
	// Lifetime of the new sandbox, counted from the fork; 0 = the source's lifetime.
	Lifetime time.Duration
	// EgressSecretValues are the values of the source's egress secrets for the new
	// sandbox (runtime.Spec.EgressSecretValues), resolved again by the caller as for a
	// create: handed to the backend, never kept, returned or logged (docs/secrets.md).
	EgressSecretValues map[string]string `json:"-"`
}

// ForkResult is the outcome of one ForkTarget.
type ForkResult struct {
	Sandbox Sandbox
	Err     error
}

// ReasonMoved: a paused sandbox that moved to another runner (PortHandle.Moved): it runs
// there under the same ID; this runner forgot it.
const ReasonMoved = "Moved"

// PortHandle is implemented by PauseHandles whose runner moves checkpoints through the
// blob store (the local Handle and runnerapi.Client): the gateway resumes a checkpointed
// sandbox on another runner when its own has no room (or is not allowed), and places
// forks on other runners, with them. Both runners share the platform's blob store.
//
//   - ExportCheckpoint writes the checkpoint of RUNNING or PAUSED sandbox id (a running or
//     frozen one pauses for the checkpoint only; a checkpointed one is read as it is and
//     stays PAUSED) to the runner's blob store under checkpoints/<id>/<export>/: its
//     parts (runtime.CheckpointPorter), then manifest.json (platform, class, each part's
//     size and sha256, the source's spec): a checkpoint is complete once its manifest
//     is. Errors: runtime.ErrNotFound, ErrNotRunning, ErrCannotCheckpoint (no blob
//     store, or the class cannot be exported: says why).
//   - ImportFork makes req.Targets from an exported checkpoint, as Fork does from a local
//     source: each target is checked against this runner's policy and capacity as a
//     Create is; the checkpoint's platform must be this runner's for the class
//     (ErrCannotCheckpoint naming both otherwise). With req.Move its one target has the
//     source's ID and keeps what the source had (creation time, lifetime, deadline —
//     moved on by the time paused when the lifetime is held —, Meta, share token): the
//     sandbox now runs here, RUNNING.
//   - DeleteCheckpoint removes an export's objects (idempotent: a missing one is no error).
//   - Moved ends PAUSED sandbox id that runs on runner to now: its checkpoint and state
//     are removed without resuming it, and it is forgotten (it ends TERMINATED with
//     ReasonMoved, and List no longer shows it).
type PortHandle interface {
	PauseHandle
	ExportCheckpoint(ctx context.Context, id string) (CheckpointRef, Sandbox, error)
	ImportFork(ctx context.Context, req ImportRequest) ([]ForkResult, error)
	DeleteCheckpoint(ctx context.Context, key string) error
	Moved(ctx context.Context, id, to string) error
}

// CheckpointRef is an exported checkpoint in the blob store.
type CheckpointRef struct {
	Key      string // its manifest's key: checkpoints/<sandbox>/<export>/manifest.json
	Platform string // runtime.CheckpointExport.Platform
	Bytes    int64  // the parts' stored (compressed) bytes
	// Egress is the exported sandbox's egress-secret state (its CA, key included, and
	// placeholders; no values): nil when it has no egress secrets. It travels with the
	// ref over the runner wire from the export to the import only, never through the
	// blob store, and is never stored or logged (docs/secrets.md, "Forks and moves").
	Egress *runtime.EgressState `json:"-"`
}

// ImportRequest is one ImportFork.
type ImportRequest struct {
	Ref CheckpointRef
	// Source is the exported sandbox as its runner reported it at the export (its Spec,
	// without pull credentials, is what every target is made of; CreatedAt, Lifetime,
	// Deadline and Pause are what a move keeps).
	Source  Sandbox
	Targets []ForkTarget
	// Move: Targets is one target with Source's ID; see PortHandle.
	Move bool
}
