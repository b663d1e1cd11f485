package sbxcli

import (
	"fmt"
	"strings"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
)

// prepullSummary is a runner's image pre-pull (issue 22) in one line, as runner get
// shows it: how many images in each state, those left out and hidden, when reported;
// "" when the runner reports none.
func prepullSummary(p *controlplanev1.PrepullStatus) string {
	if p == nil {
		return ""
	}
	n := map[controlplanev1.PrepullState]int{}
	for _, im := range p.GetImages() {
		n[im.GetState()]++
	}
	out := fmt.Sprintf("%d image(s): %d present, %d pulling, %d pending, %d failed", len(p.GetImages()),
		n[controlplanev1.PrepullState_PREPULL_PRESENT], n[controlplanev1.PrepullState_PREPULL_PULLING],
		n[controlplanev1.PrepullState_PREPULL_PENDING], n[controlplanev1.PrepullState_PREPULL_FAILED])
	if l := p.GetLeftOut(); l > 0 {
		out += fmt.Sprintf("; %d more not listed (beyond the runner's bound)", l)
	}
	if h := p.GetHidden(); h > 0 {
		out += fmt.Sprintf("; %d of other organizations' templates not shown", h)
	}
	if t := p.GetReportTime(); t != nil {
		out += "; reported " + ts(t)
	}
	return out
}

// prepullImageLine is one pre-pulled image in one line: reference, state, template,
// nodes (Kubernetes runners), the last error and the next attempt. The strings are the
// runner's: shown through shown.
func prepullImageLine(im *controlplanev1.ImagePrepull) string {
	parts := []string{shown(im.GetImage()), strings.TrimPrefix(im.GetState().String(), "PREPULL_")}
	if org, tmpl := im.GetOrganizationId(), im.GetTemplateId(); tmpl != "" {
		parts = append(parts, "template "+shown(org)+"/"+shown(tmpl))
	}
	if im.GetNodesTotal() > 0 {
		parts = append(parts, fmt.Sprintf("on %d of %d nodes", im.GetNodesPresent(), im.GetNodesTotal()))
	}
	if e := im.GetLastError(); e != "" {
		parts = append(parts, "error: "+shown(e))
	}
	if t := im.GetNextAttemptTime(); t != nil {
		parts = append(parts, "next "+ts(t))
	}
	return strings.Join(parts, ", ")
}
