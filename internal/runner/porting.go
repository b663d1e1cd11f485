package runner

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// Checkpoints through the blob store (PortHandle). Contract stubs: not built yet.

var errPortNotBuilt = fmt.Errorf("%w: moving checkpoints between runners", errdefs.ErrNotImplemented)

// ExportCheckpoint implements PortHandle for the runner.
func (r *Runner) ExportCheckpoint(ctx context.Context, id string) (CheckpointRef, Sandbox, error) {
	return CheckpointRef{}, Sandbox{}, errPortNotBuilt
}

// ImportFork implements PortHandle for the runner.
func (r *Runner) ImportFork(ctx context.Context, req ImportRequest) ([]ForkResult, error) {
	return nil, errPortNotBuilt
}

// DeleteCheckpoint implements PortHandle for the runner.
func (r *Runner) DeleteCheckpoint(ctx context.Context, key string) error { return errPortNotBuilt }

// Moved implements PortHandle for the runner.
func (r *Runner) Moved(ctx context.Context, id, to string) error { return errPortNotBuilt }
