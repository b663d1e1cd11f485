package enroll

import (
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

var prepullStates = map[runtime.PrepullState]controlplanev1.PrepullState{
	runtime.PrepullPending: controlplanev1.PrepullState_PREPULL_PENDING,
	runtime.PrepullPulling: controlplanev1.PrepullState_PREPULL_PULLING,
	runtime.PrepullPresent: controlplanev1.PrepullState_PREPULL_PRESENT,
	runtime.PrepullFailed:  controlplanev1.PrepullState_PREPULL_FAILED,
}

// PrepullStatus is a backend's pre-pull report as the heartbeat carries it, within the control plane's bounds
// (an image beyond them is counted as left out, not sent).
func PrepullStatus(rep runtime.PrepullReport) *controlplanev1.PrepullStatus {
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
