package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// Sandbox templates (SandboxTemplateService): organization-scoped partial specs
// (PartialSandboxSpec) that sandboxes start from. Calls name a template by its ID or its
// display name (unique in the organization). Writes need the SANDBOX_ADMIN role; anyone
// in the organization reads and starts from them. A template carries no authority: the
// runner's policy checks the merged spec exactly like a hand-written one.

// Template is a sandbox template as last seen.
type Template struct {
	ID          string
	DisplayName string
	// Spec is what a sandbox made from the template starts with; overrides replace the
	// fields they set (see CreateFromTemplate).
	Spec *sandboxv1.PartialSandboxSpec
	// Revision is incremented by every update.
	Revision    int64
	CreatedAt   time.Time
	UpdatedAt   time.Time
	DeletedAt   time.Time // zero unless Deleted
	CreatedBy   string
	Deleted     bool
	RequiresCKS bool
	// Attachments are free-form data kept with the template.
	Attachments *structpb.Struct

	proto *sandboxv1.SandboxTemplate
}

// Proto returns the template message received.
func (t *Template) Proto() *sandboxv1.SandboxTemplate { return t.proto }

func templateFromProto(p *sandboxv1.SandboxTemplate) *Template {
	t := &Template{
		ID: p.GetSandboxTemplateId(), DisplayName: p.GetDisplayName(), Spec: p.GetSpec(), Revision: p.GetRevision(),
		CreatedBy: p.GetCreateUserId(), Deleted: p.GetDeleted(), RequiresCKS: p.GetRequiresCks(),
		Attachments: p.GetAttachments(), proto: p,
	}
	if ts := p.GetCreateTime(); ts != nil {
		t.CreatedAt = ts.AsTime()
	}
	if ts := p.GetUpdateTime(); ts != nil {
		t.UpdatedAt = ts.AsTime()
	}
	if ts := p.GetDeleteTime(); ts != nil {
		t.DeletedAt = ts.AsTime()
	}
	return t
}

// CreateTemplate stores a new template named displayName (required, unique in the
// organization: a taken name is ErrAlreadyExists). Transient failures are retried with
// the same request ID, so a retry never makes a second template.
func (c *Client) CreateTemplate(ctx context.Context, displayName string, spec *sandboxv1.PartialSandboxSpec) (*Template, error) {
	return c.CreateTemplateProto(ctx, &sandboxv1.SandboxTemplate{DisplayName: displayName, Spec: spec})
}

// CreateTemplateProto is CreateTemplate with a wire template (e.g. with Attachments).
func (c *Client) CreateTemplateProto(ctx context.Context, t *sandboxv1.SandboxTemplate) (*Template, error) {
	if t.GetDisplayName() == "" {
		return nil, errors.New("sandbox: a template needs a display name")
	}
	req := &sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: t, RequestId: newUUID()}
	var out *Template
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, getTimeout)
		defer cancel()
		res, err := c.tmpl.CreateSandboxTemplate(cctx, connect.NewRequest(req))
		if err != nil {
			return fromRPC(err)
		}
		out = templateFromProto(res.Msg)
		return nil
	})
	return out, err
}

// GetTemplate returns the template nameOrID (its ID or display name); a deleted one
// only with showDeleted and by ID (a name names a template that is not deleted). A
// missing one is ErrTemplateNotFound.
func (c *Client) GetTemplate(ctx context.Context, nameOrID string, showDeleted bool) (*Template, error) {
	if nameOrID == "" {
		return nil, errors.New("sandbox: GetTemplate needs a template ID or name")
	}
	var out *Template
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, getTimeout)
		defer cancel()
		res, err := c.tmpl.GetSandboxTemplate(cctx, connect.NewRequest(&sandboxv1.GetSandboxTemplateRequest{
			SandboxTemplateId: nameOrID, ShowDeleted: showDeleted,
		}))
		if err != nil {
			return fromRPC(err)
		}
		out = templateFromProto(res.Msg)
		return nil
	})
	return out, err
}

// TemplateListOptions filter ListTemplates.
type TemplateListOptions struct {
	ShowDeleted bool  // deleted templates too
	PageSize    int32 // 0 = server default
}

// ListTemplates returns the organization's templates, following page tokens.
func (c *Client) ListTemplates(ctx context.Context, opts TemplateListOptions) ([]*Template, error) {
	ctx, cancel := withTimeout(ctx, listTimeout)
	defer cancel()
	items, err := collectPages(ctx, maxListPages, func(ctx context.Context, token string) ([]*sandboxv1.SandboxTemplate, string, error) {
		var res *connect.Response[sandboxv1.ListSandboxTemplatesResponse]
		err := retry(ctx, retryBudget, func(ctx context.Context) error {
			var err error
			res, err = c.tmpl.ListSandboxTemplates(ctx, connect.NewRequest(&sandboxv1.ListSandboxTemplatesRequest{
				PageSize: opts.PageSize, PageToken: token, ShowDeleted: opts.ShowDeleted,
			}))
			return fromRPC(err)
		})
		if err != nil {
			return nil, "", err
		}
		return res.Msg.GetSandboxTemplates(), res.Msg.GetNextPageToken(), nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Template, len(items))
	for i, p := range items {
		out[i] = templateFromProto(p)
	}
	return out, nil
}

// TemplateUpdate is what UpdateTemplate changes; the update mask is made of the fields
// set. At least one must be.
type TemplateUpdate struct {
	DisplayName string // "" = unchanged
	// Spec replaces the template's whole spec, or with SpecFields only those top-level
	// fields of it (a field named there but unset in Spec is cleared). nil = unchanged.
	Spec *sandboxv1.PartialSandboxSpec
	// SpecFields are top-level PartialSandboxSpec field names (proto names, e.g.
	// "max_lifetime_seconds", "containers"): mask paths spec.<field>.
	SpecFields  []string
	Attachments *structpb.Struct // nil = unchanged
	// Revision, when non-zero, is the revision the caller read: the update applies only
	// if the template is still at it, else ErrRevisionMismatch (read again).
	Revision int64
}

// mask is the update mask of u.
func (u TemplateUpdate) mask() ([]string, error) {
	var paths []string
	if u.DisplayName != "" {
		paths = append(paths, "display_name")
	}
	switch {
	case len(u.SpecFields) > 0 && u.Spec == nil:
		return nil, errors.New("sandbox: TemplateUpdate.SpecFields needs Spec")
	case len(u.SpecFields) > 0:
		seen := map[string]bool{}
		for _, f := range u.SpecFields {
			name, ok := SpecFieldName(f)
			if !ok {
				return nil, fmt.Errorf("sandbox: TemplateUpdate.SpecFields: PartialSandboxSpec has no field %q", f)
			}
			if !seen[name] {
				seen[name] = true
				paths = append(paths, "spec."+name)
			}
		}
	case u.Spec != nil:
		paths = append(paths, "spec")
	}
	if u.Attachments != nil {
		paths = append(paths, "attachments")
	}
	if len(paths) == 0 {
		return nil, errors.New("sandbox: the template update changes nothing: set DisplayName, Spec or Attachments")
	}
	return paths, nil
}

// UpdateTemplate changes the template nameOrID as u says and returns it with its new
// revision. It is not retried (a lost answer may have applied it: read the template).
func (c *Client) UpdateTemplate(ctx context.Context, nameOrID string, u TemplateUpdate) (*Template, error) {
	if nameOrID == "" {
		return nil, errors.New("sandbox: UpdateTemplate needs a template ID or name")
	}
	paths, err := u.mask()
	if err != nil {
		return nil, err
	}
	cctx, cancel := withTimeout(ctx, getTimeout)
	defer cancel()
	res, err := c.tmpl.UpdateSandboxTemplate(cctx, connect.NewRequest(&sandboxv1.UpdateSandboxTemplateRequest{
		SandboxTemplateId: nameOrID,
		SandboxTemplate: &sandboxv1.SandboxTemplate{
			DisplayName: u.DisplayName, Spec: u.Spec, Attachments: u.Attachments, Revision: u.Revision,
		},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
	}))
	if err != nil {
		return nil, fromRPC(err)
	}
	return templateFromProto(res.Msg), nil
}

// DeleteTemplate marks the template nameOrID deleted; sandboxes made from it are not
// affected. A missing one is ErrTemplateNotFound, unless a retry finds it gone (an
// earlier attempt whose answer was lost deleted it).
func (c *Client) DeleteTemplate(ctx context.Context, nameOrID string) error {
	if nameOrID == "" {
		return errors.New("sandbox: DeleteTemplate needs a template ID or name")
	}
	attempts := 0
	return retry(ctx, retryBudget, func(ctx context.Context) error {
		attempts++
		cctx, cancel := withTimeout(ctx, deleteTimeout)
		defer cancel()
		_, err := c.tmpl.DeleteSandboxTemplate(cctx, connect.NewRequest(&sandboxv1.DeleteSandboxTemplateRequest{SandboxTemplateId: nameOrID}))
		err = fromRPC(err)
		if err != nil && attempts > 1 && errors.Is(err, ErrTemplateNotFound) {
			return nil
		}
		return err
	})
}

// FromTemplateOptions configure CreateFromTemplate.
type FromTemplateOptions struct {
	DisplayName string // the sandbox's
}

// CreateFromTemplate starts a sandbox from the template nameOrID with overrides (nil =
// none) and returns at once, like Create. The server merges replace-on-presence: a
// message or list set in overrides (even empty) replaces the template's, a scalar
// replaces it when non-zero, anything unset keeps the template's value. Lists replace
// whole, so overriding one container sends all of them (see Template.EditPrimary). The
// sandbox reports Info.SourceTemplateID and SourceTemplateRevision. A missing template is
// ErrTemplateNotFound. Transient failures are retried with the same request ID.
func (c *Client) CreateFromTemplate(ctx context.Context, nameOrID string, overrides *sandboxv1.PartialSandboxSpec, opts FromTemplateOptions) (*Sandbox, error) {
	if nameOrID == "" {
		return nil, errors.New("sandbox: CreateFromTemplate needs a template ID or name")
	}
	req := &sandboxv1.CreateSandboxFromTemplateRequest{
		TemplateId: nameOrID, Overrides: overrides, RequestId: newUUID(), DisplayName: opts.DisplayName,
	}
	return c.createRetried(ctx, func(ctx context.Context) (*connect.Response[sandboxv1.Sandbox], error) {
		return c.svc.CreateSandboxFromTemplate(ctx, connect.NewRequest(req))
	})
}

// EditPrimary returns a copy of the template's containers with edit applied to the
// primary's copy (the one marked primary, else the first; a template without containers
// gives one container "main"): the containers override that changes the primary
// container and keeps the others, since a containers override replaces the whole list.
func (t *Template) EditPrimary(edit func(*sandboxv1.PartialContainer)) []*sandboxv1.PartialContainer {
	var out []*sandboxv1.PartialContainer
	for _, pc := range t.Spec.GetContainers() {
		out = append(out, proto.Clone(pc).(*sandboxv1.PartialContainer))
	}
	if len(out) == 0 {
		out = []*sandboxv1.PartialContainer{{Name: "main"}}
	}
	edit(out[primaryIndex(out, (*sandboxv1.PartialContainer).GetPrimary)])
	return out
}

// Overrides are the common overrides of a sandbox started from a template, in Go
// terms; a zero field keeps the template's value. The primary-container fields (Image
// to Memory) edit a copy of the template's primary container (Template.EditPrimary), so
// the template is read first when one is set.
type Overrides struct {
	Image string
	// Command, when set, replaces the primary's command, and its arguments with Args;
	// Args alone (non-nil) replaces only the arguments.
	Command string
	Args    []string
	// Env is added to the primary's environment (a name it already has gets this value).
	Env        map[string]string
	WorkingDir string
	CPU        string // request and limit, e.g. "500m"
	Memory     string // request and limit, e.g. "512Mi"

	Lifetime time.Duration
	// Tags, RunnerIDs and Annotations replace the template's when non-empty (an empty
	// list or map is not told apart from an unset one on the wire).
	Tags        []string
	RunnerIDs   []string
	Annotations map[string]string
	Publish     []Endpoint   // non-empty: replaces the template's services
	Egress      []EgressRule // non-empty or DenyEgress: replaces the template's network options
	DenyEgress  bool
}

func (o Overrides) touchesPrimary() bool {
	return o.Image != "" || o.Command != "" || o.Args != nil || len(o.Env) > 0 || o.WorkingDir != "" || o.CPU != "" || o.Memory != ""
}

// Partial is the wire form of o; t is the template it applies to (needed only when o
// touches the primary container).
func (o Overrides) Partial(t *Template) (*sandboxv1.PartialSandboxSpec, error) {
	p := &sandboxv1.PartialSandboxSpec{Tags: o.Tags, RunnerIds: o.RunnerIDs, Annotations: o.Annotations}
	if o.touchesPrimary() {
		if t == nil {
			return nil, errors.New("sandbox: container overrides need the template (they send its containers)")
		}
		p.Containers = t.EditPrimary(o.editPrimary)
	}
	if o.Lifetime > 0 {
		p.MaxLifetimeSeconds = int32(min(math.Ceil(o.Lifetime.Seconds()), math.MaxInt32))
	}
	if len(o.RunnerIDs) > 0 {
		p.Mode = sandboxv1.SandboxMode_SANDBOX_MODE_CKS
	}
	p.Services = (Spec{Publish: o.Publish}).Proto().GetServices()
	p.Network = networkOptions(o.Egress, o.DenyEgress)
	return p, nil
}

func (o Overrides) editPrimary(c *sandboxv1.PartialContainer) {
	if o.Image != "" {
		c.Image = o.Image
	}
	if o.Command != "" {
		c.Command, c.Args = o.Command, o.Args
	} else if o.Args != nil {
		c.Args = o.Args
	}
	if len(o.Env) > 0 {
		env := maps.Clone(c.GetEnvironmentVariables())
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, o.Env)
		c.EnvironmentVariables = env
	}
	if o.WorkingDir != "" {
		c.WorkingDir = o.WorkingDir
	}
	if o.CPU != "" || o.Memory != "" {
		rr := c.GetResourceRequirements()
		if rr == nil {
			rr = &sandboxv1.ResourceRequirements{}
		}
		for _, r := range []**sandboxv1.Resources{&rr.Requests, &rr.Limits} {
			if *r == nil {
				*r = &sandboxv1.Resources{}
			}
			if o.CPU != "" {
				(*r).Cpu = o.CPU
			}
			if o.Memory != "" {
				(*r).Memory = o.Memory
			}
		}
		c.ResourceRequirements = rr
	}
}

// RunTemplate is CreateFromTemplate with Go overrides. When they touch the primary
// container it reads the template first and starts from the template ID it read, with
// its containers (a concurrent update of the containers between the read and the
// create is overwritten for this sandbox only).
func (c *Client) RunTemplate(ctx context.Context, nameOrID string, o Overrides, opts FromTemplateOptions) (*Sandbox, error) {
	var t *Template
	if o.touchesPrimary() {
		var err error
		if t, err = c.GetTemplate(ctx, nameOrID, false); err != nil {
			return nil, err
		}
		nameOrID = t.ID
	}
	p, err := o.Partial(t)
	if err != nil {
		return nil, err
	}
	if proto.Equal(p, &sandboxv1.PartialSandboxSpec{}) {
		p = nil
	}
	return c.CreateFromTemplate(ctx, nameOrID, p, opts)
}

// SpecFieldName returns the proto name of the PartialSandboxSpec field f, given as
// protojson accepts it (proto or JSON name: "maxLifetimeSeconds" → "max_lifetime_seconds").
func SpecFieldName(f string) (string, bool) {
	fields := (&sandboxv1.PartialSandboxSpec{}).ProtoReflect().Descriptor().Fields()
	fd := fields.ByJSONName(f)
	if fd == nil {
		fd = fields.ByName(protoreflect.Name(f))
	}
	if fd == nil {
		return "", false
	}
	return string(fd.Name()), true
}
