package main

import (
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	sbxruntime "github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
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
	return prepullProto(rep)
}

var prepullStates = map[sbxruntime.PrepullState]controlplanev1.PrepullState{
	sbxruntime.PrepullPending: controlplanev1.PrepullState_PREPULL_PENDING,
	sbxruntime.PrepullPulling: controlplanev1.PrepullState_PREPULL_PULLING,
	sbxruntime.PrepullPresent: controlplanev1.PrepullState_PREPULL_PRESENT,
	sbxruntime.PrepullFailed:  controlplanev1.PrepullState_PREPULL_FAILED,
}

// prepullProto is rep as the heartbeat carries it, within the control plane's bounds
// (an image beyond them is counted as left out, not sent).
func prepullProto(rep sbxruntime.PrepullReport) *controlplanev1.PrepullStatus {
	out := &controlplanev1.PrepullStatus{LeftOut: int32(rep.LeftOut)}
	ts := func(t time.Time) *timestamppb.Timestamp {
		if t.IsZero() {
			return nil
		}
		return timestamppb.New(t)
	}
	for _, im := range rep.Images {
		org, tmpl, _ := strings.Cut(im.Target, "/")
		if len(out.Images) >= controlplane.MaxPrepullImages || len(im.Image) > controlplane.MaxPrepullImageRef ||
			len(org) > controlplane.MaxPrepullID || len(tmpl) > controlplane.MaxPrepullID {
			out.LeftOut++ // what the control plane would refuse the heartbeat for
			continue
		}
		out.Images = append(out.Images, &controlplanev1.ImagePrepull{
			Image: im.Image, OrganizationId: org, TemplateId: tmpl,
			State:        prepullStates[im.State],
			NodesPresent: int32(im.NodesPresent), NodesTotal: int32(im.NodesTotal),
			LastError:       textclip.Clip(im.LastError, controlplane.MaxPrepullError),
			LastAttemptTime: ts(im.LastAttempt), NextAttemptTime: ts(im.NextAttempt),
		})
	}
	return out
}
