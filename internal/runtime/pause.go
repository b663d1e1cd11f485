package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Pause, resume and fork (sandboxd.sandbox.v1.SandboxStateService).
//
// A sandbox is paused one of two ways:
//   - frozen: every process of the sandbox is frozen in place (the cgroup freezer). Instant
//     and available for every runtime class of the local backend; memory stays allocated
//     and is still counted against the runner's capacity.
//   - checkpointed (Released): the sandbox's whole state — processes, memory, its root
//     filesystem's writes and its scratch volumes — is saved on the host and its
//     processes end, so its CPU and memory are free. Only runtime classes whose
//     PauseSupport says Checkpoint (gVisor: runsc checkpoint/restore).
//
// Resume continues a paused sandbox under the same ID, address and endpoints; its
// processes continue where they were (a checkpointed sandbox's open TCP connections to
// the outside are reset). Fork makes new sandboxes from a checkpoint of a running or
// paused one: each a copy of its memory, processes and files, with its own ID, network
// namespace and address; scratch volumes and the writable layer are copy-on-write clones
// where the backend can (btrfs), never shared.
//
// While a sandbox is paused its backend's Wait does not return; Stop and Destroy work
// as for a running sandbox (a checkpointed sandbox's Stop discards the checkpoint and
// Wait then returns an Exit with Reason "Stopped"). DialAgent on a paused sandbox is
// ErrPaused. Recover reports a checkpointed sandbox with Recovered.Paused set, a
// frozen one as it finds it (still frozen, Paused set, Released false).

// Errors of pausing.
var (
	// ErrPaused: the sandbox is paused (DialAgent, exec, files); resume it first.
	ErrPaused = errors.New("sandbox is paused")
	// ErrNotPaused: Resume of a sandbox that is not paused.
	ErrNotPaused = errors.New("sandbox is not paused")
	// ErrAlreadyPaused: Pause of a paused sandbox.
	ErrAlreadyPaused = errors.New("sandbox is already paused")
	// ErrCheckpointLost: a checkpointed sandbox's checkpoint is unusable (incomplete,
	// removed, corrupt); it cannot be resumed and is to be ended with this reason.
	ErrCheckpointLost = errors.New("the sandbox's checkpoint is lost")
	// ErrNodeAgentUnavailable: the node agent a pause, resume or checkpoint deletion
	// needs (the Kubernetes backend's, on the sandbox's node) cannot be reached now: the
	// dial, its TLS handshake or the transport failed, the call timed out, the agent
	// answered UNAVAILABLE, or the node is missing from the cluster but not yet taken
	// as gone. Retryable; the sandbox is left as it was.
	ErrNodeAgentUnavailable = errors.New("the node agent cannot be reached")
	// ErrNodeAgentRefused: the node agent answered and refused the call (its quota, a
	// sandbox it does not find, an invalid argument, a checkpoint that failed on the
	// node, ...) or answered wrongly. The agent's own text stays in the runner's log.
	ErrNodeAgentRefused = errors.New("the node agent refused the call")
	// ErrCheckpointSpaceExhausted: the checkpoint store has no room for the checkpoint a
	// pause releasing resources or a fork needs. Every backend that limits its
	// checkpoints says it with this, so the API answers one RESOURCE_EXHAUSTED
	// CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED for all: the Kubernetes backend when the
	// node agent refused the checkpoint RESOURCE_EXHAUSTED, over its --quota-bytes or
	// under its --min-free-bytes (that error is ErrNodeAgentRefused too); the local
	// backend when the checkpoint's estimate does not fit the runner's
	// --checkpoint-quota-bytes or --checkpoint-min-free-bytes (local.Config). The
	// sandbox is left as it was; the call can succeed once checkpoints are deleted
	// (sandboxes resumed or ended).
	ErrCheckpointSpaceExhausted = errors.New("no space is left for the checkpoint")
)

// PauseSupport says how sandboxes of one runtime class can be paused on a backend.
type PauseSupport struct {
	Freeze     bool // a cgroup freeze (memory kept and counted)
	Checkpoint bool // a full checkpoint: pause releasing resources, and fork
	// Why says, when Checkpoint is false, what is missing, for refusals ("runc needs
	// CRIU, and `criu check` fails on this host: use the gvisor runtime class").
	Why string
}

// Pauser is implemented by backends that can pause sandboxes.
type Pauser interface {
	// PauseSupport reports what the backend can do for sandboxes of runtime class
	// ("" = its default class).
	PauseSupport(class string) PauseSupport
	// Pause pauses running sandbox id, checkpointing it when release is set (which
	// PauseSupport must allow, else errdefs.ErrNotImplemented), freezing it otherwise.
	// Pausing a paused sandbox is ErrAlreadyPaused. On an error
	// the sandbox is left running as it was (a checkpoint that fails half way is
	// discarded and the sandbox continues).
	Pause(ctx context.Context, id string, release bool) (PauseInfo, error)
	// Resume continues paused sandbox id (ErrNotPaused if it is not) (same ID, same address where it is free,
	// otherwise Info says the new one). It returns once the sandbox's agent answers.
	// On an error a checkpointed sandbox stays paused with its checkpoint intact, so
	// Resume can be tried again; ErrCheckpointLost says it cannot be.
	Resume(ctx context.Context, id string) (Info, error)
}

// Forker is implemented by backends that fork sandboxes (PauseSupport.Checkpoint).
type Forker interface {
	// Fork creates each of specs (complete specs: a new ID and Meta each, the source's
	// containers, volumes and runtime class) as a copy of sandbox src, running or
	// paused: its memory and processes from a checkpoint, its root filesystem's writes
	// and scratch volumes copied (copy-on-write where possible). A running source is
	// paused for the checkpoint only (checkpoint, leave running). It returns one Info
	// or one error per spec, in order; a fork that failed leaves nothing behind.
	Fork(ctx context.Context, src string, specs []*Spec) ([]Info, []error)
}

// EgressCAExpirer is a Forker whose sandboxes with egress secrets have a CA of their own
// that their forks keep (docs/secrets.md, "Forks and moves"): the runner refuses a fork
// whose lifetime would end after it.
type EgressCAExpirer interface {
	// EgressCAExpiry is when sandbox id's egress CA expires (false: it has none).
	EgressCAExpiry(id string) (time.Time, bool)
}

// PauseInfo describes a pause.
type PauseInfo struct {
	Released bool          // checkpointed: processes ended, CPU and memory released
	Took     time.Duration // how long the pause took
	// CheckpointBytes is the checkpoint's size on disk (memory image and saved file
	// state); 0 for a freeze.
	CheckpointBytes int64
}

// CheckpointPorter is implemented by Forkers whose checkpoints can move to another host:
// a sandbox paused on one runner resumes on another, or is forked there, through the
// blob store. An exported checkpoint is a list of parts, each an internal/fsarchive
// stream (a zstd-compressed tar): what the part names mean is the backend's (the local
// backend: "image", the memory image; "run", the agent's state dir; "volume-<index>",
// each disk volume of the spec). A checkpoint is restored only by a backend whose
// CheckpointPlatform for its class is the very same string; the spec of every sandbox
// made from it is the exported sandbox's, image pinned to its digest.
type CheckpointPorter interface {
	// CheckpointPlatform names what restoring a checkpoint of runtime class ("" = the
	// default class) needs, exactly: the class's kind, the checkpointer's version and the
	// architecture (e.g. "gvisor runsc-<version> linux/amd64"); "" when this backend
	// exports no checkpoints of class.
	CheckpointPlatform(class string) string
	// ExportCheckpoint takes sandbox id's state as Fork does (a checkpointed sandbox's
	// checkpoint as it is; a running or frozen one checkpointed, paused for the
	// checkpoint and its volumes' snapshots only, then continuing as it was) and writes
	// it through put, one part after another (put reads its reader to the end or fails).
	// Nothing of the sandbox changes; what it made for the export is removed before it
	// returns. Errors: ErrNotFound, errdefs.ErrNotImplemented (cannot be exported: says
	// why), put's errors.
	ExportCheckpoint(ctx context.Context, id string, put func(ctx context.Context, part string, r io.Reader) error) (CheckpointExport, error)
	// ForkFromCheckpoint is Fork with an exported checkpoint as the source: open reads one
	// of cp's parts (a reader that fails rather than return io.EOF on content that does
	// not match what was exported: blob.Store.Get). Each part is read once, before any
	// sandbox is made, and bounded while it is unpacked (limits derived from the specs:
	// it is sandbox-made content). specs are complete (a new ID and Meta each; the
	// exported sandbox's containers, volumes and runtime class). A move (resume on another
	// runner) is a ForkFromCheckpoint of one spec with the source's ID. It returns one
	// Info or one error per spec, in order; errors of the whole call are every spec's
	// (a platform mismatch: errdefs.ErrNotImplemented naming both platforms).
	ForkFromCheckpoint(ctx context.Context, cp CheckpointExport, open func(ctx context.Context, part string) (io.ReadCloser, error), specs []*Spec) ([]Info, []error)
}

// CheckpointExport describes an exported checkpoint.
type CheckpointExport struct {
	Platform string   // CheckpointPlatform of the sandbox's class where it was exported
	Class    string   // the sandbox's runtime class
	Parts    []string // part names, in the order written (and read)
	// Bytes is the parts' content before compression (ArchiveStats.Bytes summed).
	Bytes int64
	Took  time.Duration // how long the source was paused for it (0: it was checkpointed)
	// Egress is the sandbox's egress-secret state (nil: it has no egress secrets): set by
	// ExportCheckpoint, given to ForkFromCheckpoint. Never part of the parts or the blob
	// store: the runner carries it over the runner wire only (docs/secrets.md).
	Egress *EgressState
}

// EgressState is what another runner needs to serve a sandbox's egress secrets after a
// move or a fork there (docs/secrets.md, "Forks and moves"): the sandbox's CA, which its
// restored processes trust, and per injection its host, header, placeholder and secret
// name. Never a secret's value: the receiving runner is given those again, resolved by
// the gateway from the store by the secret's name. The CA key is as sensitive as a
// secret: it is never written to a file or the blob store, logged or returned by the API.
type EgressState struct {
	CACert     []byte // DER
	CAKey      []byte `json:"-"` // PKCS#8 DER
	Injections []EgressInjection
}

// EgressInjection is one injection of an EgressState.
type EgressInjection struct {
	Host, Header, Placeholder string
	Secret                    string // runtime.EgressSecret.Key()
}

// String never shows the key (a state printed or logged by mistake).
func (s *EgressState) String() string {
	if s == nil {
		return "<nil>"
	}
	return fmt.Sprintf("egress state (%d injections, CA key redacted)", len(s.Injections))
}

// LogValue never shows the key.
func (s *EgressState) LogValue() slog.Value { return slog.StringValue(s.String()) }

// GoString never shows the key.
func (s *EgressState) GoString() string { return s.String() }
