package main

import (
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/enroll"
	sbxruntime "github.com/sandboxd/sandboxd/internal/runtime"
)

// prepullReporter is a runner whose backend may pre-pull templates' images
// (runner.Local).
type prepullReporter interface {
	PrepullReport() (sbxruntime.PrepullReport, bool)
}

// prepullStatus is what a heartbeat reports of h's image pre-pull (issue 22); nil when
// h is no prepullReporter, its backend does not pre-pull, or it wants no image.
func prepullStatus(h any) *controlplanev1.PrepullStatus {
	pr, ok := h.(prepullReporter)
	if !ok {
		return nil
	}
	rep, ok := pr.PrepullReport()
	if !ok || (len(rep.Images) == 0 && rep.LeftOut == 0) {
		return nil
	}
	return enroll.PrepullStatus(rep)
}
