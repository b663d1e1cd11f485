package runtime

import (
	"errors"
	"fmt"
)

// Bounds of a container-engine sandbox (Spec.Engine).
const (
	// MaxEngineComposeBytes bounds Engine.Compose: the public API's bound on a Compose
	// file (256 KiB), with room for its normalization.
	MaxEngineComposeBytes = 512 << 10
	// MaxEngineImages bounds Engine.Images (one per service at most).
	MaxEngineImages = 64
	// maxImageRefLen bounds one image reference.
	maxImageRefLen = 1024
)

// ErrEngineUnsupported: the backend (or the runner) cannot run a container-engine
// sandbox. Backends that cannot refuse Spec.Engine with it, never run the spec without
// its engine.
var ErrEngineUnsupported = errors.New("container-engine sandboxes (control CONTROL_CONTAINER_ENGINE) are not supported")

// EngineHost is implemented by backends that can run container-engine sandboxes
// (Spec.Engine): EngineUnavailable is "" when the backend runs one under runtime class
// class, else why not. A backend that does not implement it runs none.
type EngineHost interface {
	EngineUnavailable(class string) string
}

// validateEngine checks the shape of a container-engine spec: one container, named
// EngineContainerName, and a bounded file, project and image list.
func validateEngine(spec *Spec) error {
	e := spec.Engine
	if e == nil {
		return nil
	}
	switch {
	case len(spec.Sidecars) > 0 || len(spec.InitContainers) > 0:
		return fmt.Errorf("%w: a container-engine sandbox has one container (%s); its services run under the engine", ErrInvalidSpec, EngineContainerName)
	case spec.Container.Name != EngineContainerName:
		return fmt.Errorf("%w: the container of a container-engine sandbox is named %q, got %q", ErrInvalidSpec, EngineContainerName, spec.Container.Name)
	case len(e.Compose) == 0 || len(e.Compose) > MaxEngineComposeBytes:
		return fmt.Errorf("%w: engine compose file of %d bytes: want 1-%d", ErrInvalidSpec, len(e.Compose), MaxEngineComposeBytes)
	case !ValidContainerName(e.Project):
		return fmt.Errorf("%w: engine project %q: want a DNS-1123 label", ErrInvalidSpec, e.Project)
	case len(e.Images) > MaxEngineImages:
		return fmt.Errorf("%w: %d engine images: at most %d", ErrInvalidSpec, len(e.Images), MaxEngineImages)
	}
	for _, img := range e.Images {
		if img == "" || len(img) > maxImageRefLen {
			return fmt.Errorf("%w: engine image reference of %d bytes: want 1-%d", ErrInvalidSpec, len(img), maxImageRefLen)
		}
	}
	return nil
}
