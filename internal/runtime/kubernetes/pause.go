package kubernetes

import (
	"context"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// noPauseWhy says why this backend pauses nothing, for the runner's refusals
// (FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED). A Pod cannot be frozen or
// checkpointed through the Kubernetes API this backend uses: freezing needs the node's
// cgroups, and a memory checkpoint needs gVisor as the Pods' RuntimeClass plus a
// checkpoint/restore API for Pods that upstream Kubernetes does not have (the kubelet's
// checkpoint endpoint is CRIU-based and forensic only: it cannot restore). docs/api.md
// ("On Kubernetes") says what a cluster would need.
const noPauseWhy = "the Kubernetes backend cannot pause, resume or fork sandboxes: Kubernetes has no API to freeze or restore a Pod " +
	"(pause, resume and fork need a local (runc/gVisor) runner; fork and pausing with released resources need its gvisor runtime class)"

// PauseSupport implements runtime.Pauser: nothing, with the reason.
func (b *Backend) PauseSupport(string) runtime.PauseSupport {
	return runtime.PauseSupport{Why: noPauseWhy}
}

// Pause implements runtime.Pauser: always refused (see noPauseWhy).
func (b *Backend) Pause(context.Context, string, bool) (runtime.PauseInfo, error) {
	return runtime.PauseInfo{}, fmt.Errorf("%w: %s", errdefs.ErrNotImplemented, noPauseWhy)
}

// Resume implements runtime.Pauser: nothing is ever paused here.
func (b *Backend) Resume(context.Context, string) (runtime.Info, error) {
	return runtime.Info{}, fmt.Errorf("%w: %s", runtime.ErrNotPaused, noPauseWhy)
}

var _ runtime.Pauser = (*Backend)(nil)
