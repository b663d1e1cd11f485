package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Warm pools of templates (issue 22): a template's attachments may carry the sandboxd
// extension
//
//	"sandboxd.warmPool": {"size": N}   (0 <= N <= runtime.MaxWarmSize)
//
// asking every runner that may place the template to keep N sandboxes of it
// pre-started. Every other key under "sandboxd." is refused as unknown. The gateway
// reconciles the desired sets onto the runners (warmLoop): for each connected runner,
// the templates (of all organizations) whose spec — the template alone, as
// CreateSandboxFromTemplate without overrides resolves it — the runner's policy
// accepts, sent whole in one SetWarmPools (runner.WarmHandle), after every template
// write and every WarmInterval. Nothing of it is on the create path: a create from the
// template claims from the runner's pool as any create of that image does.
//
// A target whose image is in the platform registry carries pull credentials minted for
// the template's organization (as a create's: registrycreds.go), fresh at every send,
// and its spec names the organization (runtime.MetaOrg): the runner's pool keeps such
// containers for that organization only (local.poolKeyOf).
//
// Image pre-pull: the set sent holds every live template (of all organizations) the
// runner's policy accepts, those without a warm pool as targets of Size 0, so a runner
// pulls the images of every template it may place before any create of it
// (local.prepuller). The templates are at most maxWarmTemplates, oldest first; beyond
// that, those with a warm pool are kept first.

// WarmPoolAttachment is the attachments key of a template's warm pool.
const WarmPoolAttachment = "sandboxd.warmPool"

// DefaultWarmInterval is how often the gateway re-sends the warm sets (runners restart).
const DefaultWarmInterval = 30 * time.Second

// maxWarmTemplates bounds the templates the gateway reconciles (a runner takes at most
// runnerapi.MaxWarmTargets in one call: the same number).
const maxWarmTemplates = 1024

// warmPoolSize checks the sandboxd.* keys of a template's attachments and returns the
// warm pool size they ask for (0 without one). field is the attachments' field path.
func warmPoolSize(field string, a *structpb.Struct) (int, []apierr.Violation) {
	var (
		size int
		vs   []apierr.Violation
	)
	keys := make([]string, 0, len(a.GetFields()))
	for k := range a.GetFields() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !strings.HasPrefix(k, "sandboxd.") {
			continue
		}
		f := fmt.Sprintf("%s[%q]", field, k)
		if k != WarmPoolAttachment {
			vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("unknown sandboxd extension (known: %s)", WarmPoolAttachment)})
			continue
		}
		st := a.GetFields()[k].GetStructValue()
		if st == nil {
			vs = append(vs, apierr.Violation{Field: f, Description: `must be an object {"size": N}`})
			continue
		}
		for name := range st.GetFields() {
			if name != "size" {
				vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("unknown field %q (known: size)", name)})
			}
		}
		sv, ok := st.GetFields()["size"]
		if !ok {
			vs = append(vs, apierr.Violation{Field: f, Description: "size is required"})
			continue
		}
		n, isNum := sv.GetKind().(*structpb.Value_NumberValue)
		if !isNum || n.NumberValue != math.Trunc(n.NumberValue) || n.NumberValue < 0 || n.NumberValue > runtime.MaxWarmSize {
			vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("size must be an integer in [0, %d]", runtime.MaxWarmSize)})
			continue
		}
		size = int(n.NumberValue)
	}
	return size, vs
}

// warmTemplate is a live template, its spec resolved as a create from it without
// overrides, and its warm pool's size (0: none; its images are pre-pulled only).
type warmTemplate struct {
	ID, Org string
	Spec    *sandboxv1.SandboxSpec
	Size    int
}

// warmTemplates turns stored templates into warm templates: deleted ones and ones whose
// spec is no sandbox by itself (no image) are left out; ones without a valid warm pool
// (none, size 0, or attachments stored before they were checked) get Size 0.
func warmTemplates(ts []store.Template) []warmTemplate {
	var out []warmTemplate
	for _, t := range ts {
		if t.DeleteTime != nil {
			continue
		}
		size := 0
		if len(t.Attachments) > 0 {
			a := &structpb.Struct{}
			if err := protojson.Unmarshal(t.Attachments, a); err == nil {
				n, vs := warmPoolSize("attachments", a)
				if len(vs) == 0 {
					size = n
				}
			}
		}
		p := &sandboxv1.PartialSandboxSpec{}
		if err := proto.Unmarshal(t.Spec, p); err != nil {
			continue
		}
		full, err := spec.FromTemplate(p, nil)
		if err != nil || len(full.GetContainers()) == 0 || full.GetContainers()[0].GetImage() == "" {
			continue
		}
		out = append(out, warmTemplate{ID: t.ID, Org: t.Org, Spec: full, Size: size})
	}
	return out
}

// warmDesired is, per runner (by index), the warm targets it is to keep: the templates
// of the organizations it serves (placement.Runner.Serves) that its policy accepts (placement.Resolve, no capacity), as runtime specs the way a create
// sends them (with the organization in Meta, and registry pull credentials from mint,
// nil: none). A runner that is not ready gets nil (nothing is sent to it).
func warmDesired(tmpls []warmTemplate, runners []placement.Runner, platform policy.Platform, mint registryCredsFunc) [][]runtime.WarmTarget {
	out := make([][]runtime.WarmTarget, len(runners))
	for i, r := range runners {
		if !r.Ready {
			continue
		}
		targets := []runtime.WarmTarget{}
		for _, t := range tmpls {
			if !r.Serves(t.Org) {
				// Another organization's runner never sees the template, nor the pull
				// token minted for it (placement.ConstraintRunnerOwner).
				continue
			}
			res := placement.Resolve(t.Spec, nil, r, platform)
			if !res.OK() {
				continue
			}
			cr, err := toCreateRequest(res.Spec, nil, nil, nil)
			if err != nil {
				continue
			}
			addRegistryCredentials(mint, &cr.Spec, t.Org)
			cr.Spec.Meta = map[string]string{runtime.MetaOrg: t.Org}
			// The policy's Pod settings (node selector, tolerations, pull secrets), as a
			// create's: the Kubernetes backend pre-pulls onto the nodes they allow.
			cr.Spec.Pod = res.Pod
			targets = append(targets, runtime.WarmTarget{Key: t.Org + "/" + t.ID, Spec: cr.Spec, Size: t.Size})
		}
		out[i] = targets
	}
	return out
}

// pokeWarm asks warmLoop to reconcile now (after a template write).
func (s *Server) pokeWarm() {
	select {
	case s.warmPoke <- struct{}{}:
	default:
	}
}

// warmLoop reconciles the warm sets onto the runners after pokes and every interval.
func (s *Server) warmLoop(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		s.syncWarm(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.warmPoke:
		}
	}
}

// liveTemplates lists the templates to reconcile: every live one, at most
// maxWarmTemplates; beyond that the oldest with a warm pool first, then the oldest
// others, all in creation order.
func (s *Server) liveTemplates(ctx context.Context) ([]store.Template, error) {
	ts, err := s.templates.ListLive(ctx, maxWarmTemplates)
	if !errors.Is(err, store.ErrLimitExceeded) {
		return ts, err
	}
	s.log.Warn("warm pools: more live templates than a runner is sent; pre-pulling the oldest", "limit", maxWarmTemplates)
	warm, werr := s.templates.ListWithAttachment(ctx, WarmPoolAttachment, maxWarmTemplates)
	if werr != nil && !errors.Is(werr, store.ErrLimitExceeded) {
		return ts, nil // the oldest live ones still
	}
	return mergeTemplates(warm, ts, maxWarmTemplates), nil
}

// mergeTemplates is first, then as many of rest (not in first) as fit in limit, in
// creation order.
func mergeTemplates(first, rest []store.Template, limit int) []store.Template {
	out := slices.Clone(first[:min(len(first), limit)])
	seen := map[string]bool{}
	for _, t := range out {
		seen[t.Org+"/"+t.ID] = true
	}
	for _, t := range rest {
		if len(out) >= limit {
			break
		}
		if !seen[t.Org+"/"+t.ID] {
			out = append(out, t)
		}
	}
	slices.SortStableFunc(out, func(a, b store.Template) int {
		if c := a.CreateTime.Compare(b.CreateTime); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// syncWarm sends every ready runner that keeps warm pools its desired set.
func (s *Server) syncWarm(ctx context.Context) {
	ts, err := s.liveTemplates(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("warm pools: list templates", "err", err)
		}
		return
	}
	desired := warmDesired(warmTemplates(ts), s.views.snapshot(ctx), policy.RunnerPlatform(nil), s.registryCreds)
	for i, targets := range desired {
		wh, ok := s.runners[i].(runner.WarmHandle)
		if !ok || targets == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := wh.SetWarmPools(cctx, targets)
		cancel()
		switch {
		case err == nil || ctx.Err() != nil:
		case connect.CodeOf(err) == connect.CodeUnimplemented: // a runner of an older release
			s.log.Debug("warm pools: runner keeps none", "runner", s.runners[i].ID(), "err", err)
		default:
			s.log.Warn("warm pools: send to runner", "runner", s.runners[i].ID(), "targets", len(targets), "err", err)
		}
	}
}
