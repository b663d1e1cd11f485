package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Bounds of sandbox templates (SandboxTemplateService).
const (
	MaxTemplateSpecBytes        = 1 << 20  // the serialized PartialSandboxSpec
	MaxTemplateAttachmentsBytes = 64 << 10 // the attachments as JSON
	MaxTemplatesPerOrg          = 1000     // templates that are not deleted
	MaxTemplateNameRunes        = 128
	defaultTemplatePageSize     = 50
)

// uuidShape is a template ID: a UUID in its canonical text form. A display name never
// has this shape, so the path id of the template RPCs is an ID or a name, never both.
var uuidShape = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// templatesStore is the store of the template RPCs, or their error when there is none.
func (s *Server) templatesStore() (store.Templates, error) {
	if s.templates == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "sandbox templates need a store (this gateway has none)")
	}
	return s.templates, nil
}

func requireAdmin(ctx context.Context, rpc string) error {
	if principal(ctx).Role != auth.RoleAdmin {
		return apierr.New(apierr.PermissionDenied, rpc+" needs an API key of role "+string(auth.RoleAdmin), nil)
	}
	return nil
}

func templateNotFound(idOrName string) error {
	return apierr.New(apierr.TemplateNotFound, fmt.Sprintf("sandbox template %q not found", idOrName), map[string]string{"sandbox_template_id": idOrName})
}

// resolveTemplate finds the caller's template by ID (UUID-shaped) or display name (a
// template that is not deleted); a deleted template by ID only with showDeleted.
func (s *Server) resolveTemplate(ctx context.Context, field, idOrName string, showDeleted bool) (store.Template, error) {
	st, err := s.templatesStore()
	if err != nil {
		return store.Template{}, err
	}
	if idOrName == "" {
		return store.Template{}, apierr.Invalid(apierr.InvalidRequest, field+" is required", []apierr.Violation{{Field: field, Description: "is required (a template ID or display name)"}})
	}
	if len(idOrName) > 4*MaxTemplateNameRunes {
		return store.Template{}, templateNotFound(idOrName[:64] + "…")
	}
	org := principal(ctx).Org
	var t store.Template
	if uuidShape.MatchString(idOrName) {
		t, err = st.Get(ctx, org, strings.ToLower(idOrName))
	} else {
		t, err = st.GetByName(ctx, org, idOrName)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Template{}, templateNotFound(idOrName)
	case err != nil:
		return store.Template{}, connect.NewError(connect.CodeUnavailable, err)
	case t.DeleteTime != nil && !showDeleted:
		return store.Template{}, templateNotFound(idOrName)
	}
	return t, nil
}

// displayNameViolations: required, 1..128 runes of printable UTF-8, no space at either
// end, never UUID-shaped.
func displayNameViolations(field, name string) []apierr.Violation {
	bad := func(d string) []apierr.Violation { return []apierr.Violation{{Field: field, Description: d}} }
	switch {
	case name == "":
		return bad("is required")
	case !utf8.ValidString(name):
		return bad("must be valid UTF-8")
	case utf8.RuneCountInString(name) > MaxTemplateNameRunes:
		return bad(fmt.Sprintf("is %d characters, at most %d allowed", utf8.RuneCountInString(name), MaxTemplateNameRunes))
	case strings.TrimSpace(name) != name:
		return bad("must not begin or end with a space")
	case uuidShape.MatchString(name):
		return bad("must not have the shape of a UUID (template IDs have it)")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return bad(fmt.Sprintf("must be printable, has %U", r))
		}
	}
	return nil
}

// MaxSandboxDisplayNameRunes bounds a sandbox's display_name.
const MaxSandboxDisplayNameRunes = 256

// sandboxDisplayNameViolations checks a sandbox's display_name: optional, valid UTF-8,
// printable, at most MaxSandboxDisplayNameRunes characters. Unlike a template's, it is
// not unique and never names the sandbox in a lookup.
func sandboxDisplayNameViolations(field, name string) []apierr.Violation {
	if name == "" {
		return nil
	}
	bad := func(d string) []apierr.Violation { return []apierr.Violation{{Field: field, Description: d}} }
	switch {
	case !utf8.ValidString(name):
		return bad("must be valid UTF-8")
	case utf8.RuneCountInString(name) > MaxSandboxDisplayNameRunes:
		return bad(fmt.Sprintf("is %d characters, at most %d allowed", utf8.RuneCountInString(name), MaxSandboxDisplayNameRunes))
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return bad(fmt.Sprintf("must be printable, has %U", r))
		}
	}
	return nil
}

// checkTemplateSpec checks a template's spec for shape with the create path's
// validators, on every field it has: a template may leave out the containers (a create
// from it must then bring them). It carries no authority, so no policy is asked here: the
// runners' policies judge the resolved spec at each create.
func (s *Server) checkTemplateSpec(ctx context.Context, field string, p *sandboxv1.PartialSandboxSpec) error {
	if n := proto.Size(p); n > MaxTemplateSpecBytes {
		return apierr.Invalid(apierr.InvalidRequest, "template spec too large", []apierr.Violation{{Field: field, Description: fmt.Sprintf("is %d bytes serialized, at most %d allowed", n, MaxTemplateSpecBytes)}})
	}
	full, err := spec.ToSandboxSpec(p)
	if err != nil {
		return apierr.Invalid(apierr.InvalidRequest, "invalid template spec", []apierr.Violation{{Field: field, Description: "has fields sandboxd does not know"}})
	}
	placeholder := len(full.GetContainers()) == 0
	if placeholder {
		full.Containers = []*sandboxv1.Container{{Image: "busybox"}}
	}
	_, err = toCreateRequest(full, s.restorer(ctx, principal(ctx).Org), s.shapeOnlySecrets(), nil)
	if err == nil {
		return nil
	}
	vs := apierr.Violations(err)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || len(vs) == 0 {
		return err // NOT_IMPLEMENTED features, snapshot lookups
	}
	var out []apierr.Violation
	for _, v := range vs {
		if placeholder && strings.HasPrefix(v.Field, "sandbox.spec.containers") {
			continue // the placeholder's, not the template's
		}
		v.Field = field + strings.TrimPrefix(v.Field, "sandbox.spec")
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil
	}
	return apierr.Invalid(apierr.InvalidRequest, "invalid template spec: "+apierr.Describe(out), out)
}

// checkTemplateFields checks what a write stores: the display name, the spec and the
// attachments (their encoded form, returned).
func (s *Server) checkTemplateFields(ctx context.Context, t *sandboxv1.SandboxTemplate) (specBytes, attachments []byte, err error) {
	if vs := displayNameViolations("sandbox_template.display_name", t.GetDisplayName()); vs != nil {
		return nil, nil, apierr.Invalid(apierr.InvalidRequest, "invalid display_name: "+apierr.Describe(vs), vs)
	}
	p := discardUnknown(t.GetSpec())
	if p == nil {
		p = &sandboxv1.PartialSandboxSpec{}
	}
	t.Spec = p
	if err := s.checkTemplateSpec(ctx, "sandbox_template.spec", p); err != nil {
		return nil, nil, err
	}
	specBytes, err = proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeInternal, err)
	}
	if a := t.GetAttachments(); a != nil {
		if _, vs := warmPoolSize("sandbox_template.attachments", a); len(vs) > 0 {
			return nil, nil, apierr.Invalid(apierr.InvalidRequest, "invalid attachments: "+apierr.Describe(vs), vs)
		}
		attachments, err = protojson.Marshal(a)
		if err != nil {
			return nil, nil, apierr.Invalid(apierr.InvalidRequest, "invalid attachments", []apierr.Violation{{Field: "sandbox_template.attachments", Description: err.Error()}})
		}
		if len(attachments) > MaxTemplateAttachmentsBytes {
			return nil, nil, apierr.Invalid(apierr.InvalidRequest, "attachments too large", []apierr.Violation{{Field: "sandbox_template.attachments",
				Description: fmt.Sprintf("is %d bytes as JSON, at most %d allowed", len(attachments), MaxTemplateAttachmentsBytes)}})
		}
	}
	return specBytes, attachments, nil
}

// discardUnknown is p without unknown fields at any depth (binary clients may send
// fields this server does not know yet: ignored, never stored).
func discardUnknown(p *sandboxv1.PartialSandboxSpec) *sandboxv1.PartialSandboxSpec {
	if p == nil {
		return nil
	}
	b, err := proto.Marshal(p)
	if err != nil {
		return p
	}
	out := &sandboxv1.PartialSandboxSpec{}
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, out); err != nil {
		return p
	}
	return out
}

// templateProto is the wire form of a stored template.
func templateProto(t store.Template) (*sandboxv1.SandboxTemplate, error) {
	p := &sandboxv1.PartialSandboxSpec{}
	if err := proto.Unmarshal(t.Spec, p); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("template %s: decode spec: %w", t.ID, err))
	}
	out := &sandboxv1.SandboxTemplate{SandboxTemplateId: t.ID, DisplayName: t.DisplayName, Spec: p, Revision: t.Revision,
		CreateTime: timestamppb.New(t.CreateTime), UpdateTime: timestamppb.New(t.UpdateTime), CreateUserId: t.CreateUserID,
		Deleted: t.DeleteTime != nil}
	if t.DeleteTime != nil {
		out.DeleteTime = timestamppb.New(*t.DeleteTime)
	}
	if t.Attachments != nil {
		out.Attachments = &structpb.Struct{}
		if err := protojson.Unmarshal(t.Attachments, out.Attachments); err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("template %s: decode attachments: %w", t.ID, err))
		}
	}
	return out, nil
}

func templateResponse(t store.Template) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	p, err := templateProto(t)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(p), nil
}

// digest is a request's identity for request_id replays: sha256 over a deterministic
// encoding of m.
func digest(kind string, m proto.Message) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	sum := sha256.Sum256(append([]byte(kind+"\x00"), b...))
	return kind + ":sha256:" + hex.EncodeToString(sum[:])
}

func templateRequestIDConflict() error {
	vs := []apierr.Violation{{Field: "request_id", Description: "already created a template from a different request"}}
	return apierr.Invalid(apierr.RequestIDConflict, "request_id conflict: "+apierr.Describe(vs), vs)
}

func (s *Server) CreateSandboxTemplate(ctx context.Context, req *connect.Request[sandboxv1.CreateSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	st, err := s.templatesStore()
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "CreateSandboxTemplate"); err != nil {
		return nil, err
	}
	m := req.Msg
	if vs := requestIDViolations("request_id", m.GetRequestId()); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid request_id: "+apierr.Describe(vs), vs)
	}
	if m.GetSandboxTemplate() == nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "sandbox_template is required", []apierr.Violation{{Field: "sandbox_template", Description: "is required"}})
	}
	// Output-only fields a caller sends are ignored (AIP-203); what is stored is named,
	// the spec and the attachments.
	in := m.GetSandboxTemplate()
	specBytes, attachments, err := s.checkTemplateFields(ctx, in)
	if err != nil {
		return nil, err
	}
	p := principal(ctx)
	d := digest("template", &sandboxv1.SandboxTemplate{DisplayName: in.GetDisplayName(), Spec: in.GetSpec(), Attachments: in.GetAttachments()})
	replay := func() (*connect.Response[sandboxv1.SandboxTemplate], bool, error) {
		first, err := st.GetByRequestID(ctx, p.Org, m.GetRequestId())
		if err != nil {
			return nil, false, nil
		}
		if first.RequestDigest != d {
			return nil, true, templateRequestIDConflict()
		}
		res, err := templateResponse(first)
		return res, true, err
	}
	if m.GetRequestId() != "" {
		if res, ok, err := replay(); ok {
			return res, err
		}
	}
	t, err := st.Create(ctx, store.Template{ID: uuid.NewString(), Org: p.Org, DisplayName: in.GetDisplayName(), Spec: specBytes,
		Attachments: attachments, CreateUserID: p.KeyID, RequestID: m.GetRequestId(), RequestDigest: d}, MaxTemplatesPerOrg)
	if err != nil {
		return nil, s.templateWriteErr(err, in.GetDisplayName(), func() (*connect.Response[sandboxv1.SandboxTemplate], bool, error) { return replay() })
	}
	s.log.Info("sandbox template created", "template", t.ID, "org", p.Org, "name", t.DisplayName)
	s.pokeWarm()
	return templateResponse(t)
}

// templateWriteErr is the API error of a failed template write. replay answers a
// request_id collision (another replica created this request's template meanwhile).
func (s *Server) templateWriteErr(err error, name string, replay func() (*connect.Response[sandboxv1.SandboxTemplate], bool, error)) error {
	var dup *store.AlreadyExistsError
	switch {
	case errors.As(err, &dup) && dup.Key == store.KeyDisplayName:
		vs := []apierr.Violation{{Field: "sandbox_template.display_name", Description: fmt.Sprintf("the organization has a template named %q", name)}}
		return apierr.WithViolations(apierr.New(apierr.AlreadyExists, fmt.Sprintf("a sandbox template named %q exists", name), map[string]string{"display_name": name}), vs)
	case errors.As(err, &dup) && dup.Key == store.KeyRequestID && replay != nil:
		if _, ok, rerr := replay(); ok && rerr != nil {
			return rerr
		}
		return connect.NewError(connect.CodeAborted, errors.New("a concurrent create with this request_id: retry"))
	case errors.Is(err, store.ErrLimitExceeded):
		return apierr.New(apierr.TemplateLimitExceeded, fmt.Sprintf("the organization has %d templates, at most allowed: delete one first", MaxTemplatesPerOrg),
			map[string]string{"limit": strconv.Itoa(MaxTemplatesPerOrg)})
	case errors.Is(err, store.ErrInvalid):
		return apierr.Invalid(apierr.InvalidRequest, err.Error(), nil)
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

func (s *Server) GetSandboxTemplate(ctx context.Context, req *connect.Request[sandboxv1.GetSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	t, err := s.resolveTemplate(ctx, "sandbox_template_id", req.Msg.GetSandboxTemplateId(), req.Msg.GetShowDeleted())
	if err != nil {
		return nil, err
	}
	return templateResponse(t)
}

func (s *Server) ListSandboxTemplates(ctx context.Context, req *connect.Request[sandboxv1.ListSandboxTemplatesRequest]) (*connect.Response[sandboxv1.ListSandboxTemplatesResponse], error) {
	st, err := s.templatesStore()
	if err != nil {
		return nil, err
	}
	m := req.Msg
	size, err := apierr.PageSize(m.GetPageSize(), defaultTemplatePageSize, maxPageSize)
	if err != nil {
		return nil, err
	}
	list, next, err := st.List(ctx, principal(ctx).Org, m.GetShowDeleted(), store.Page{Size: size, Token: m.GetPageToken()})
	switch {
	case errors.Is(err, store.ErrInvalid):
		return nil, badPageToken()
	case err != nil:
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	out := &sandboxv1.ListSandboxTemplatesResponse{NextPageToken: next}
	for _, t := range list {
		p, err := templateProto(t)
		if err != nil {
			return nil, err
		}
		out.SandboxTemplates = append(out.SandboxTemplates, p)
	}
	return connect.NewResponse(out), nil
}

// templateOutputOnly are the fields of SandboxTemplate a caller cannot set.
var templateOutputOnly = map[string]bool{"sandbox_template_id": true, "revision": true, "create_time": true, "update_time": true,
	"delete_time": true, "create_user_id": true, "deleted": true, "requires_cks": true}

func (s *Server) UpdateSandboxTemplate(ctx context.Context, req *connect.Request[sandboxv1.UpdateSandboxTemplateRequest]) (*connect.Response[sandboxv1.SandboxTemplate], error) {
	st, err := s.templatesStore()
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "UpdateSandboxTemplate"); err != nil {
		return nil, err
	}
	m := req.Msg
	in := m.GetSandboxTemplate()
	if in == nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "sandbox_template is required", []apierr.Violation{{Field: "sandbox_template", Description: "is required"}})
	}
	paths := m.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		paths = []string{"display_name", "spec", "attachments"}
	}
	specFields := (&sandboxv1.PartialSandboxSpec{}).ProtoReflect().Descriptor().Fields()
	for _, path := range paths {
		name, sub, _ := strings.Cut(path, ".")
		switch {
		case templateOutputOnly[path]:
			vs := []apierr.Violation{{Field: "update_mask", Description: fmt.Sprintf("%q is output only", path)}}
			return nil, apierr.Invalid(apierr.InvalidRequest, "invalid update_mask: "+apierr.Describe(vs), vs)
		case path == "display_name" || path == "spec" || path == "attachments":
		case name == "spec" && specFields.ByName(protoreflect.Name(sub)) != nil:
		default:
			vs := []apierr.Violation{{Field: "update_mask", Description: fmt.Sprintf("%q is not display_name, spec, spec.<field of PartialSandboxSpec> or attachments", path)}}
			return nil, apierr.Invalid(apierr.InvalidRequest, "invalid update_mask: "+apierr.Describe(vs), vs)
		}
	}
	cur, err := s.resolveTemplate(ctx, "sandbox_template_id", m.GetSandboxTemplateId(), false)
	if err != nil {
		return nil, err
	}
	if id := in.GetSandboxTemplateId(); id != "" && !strings.EqualFold(id, cur.ID) {
		return nil, apierr.Invalid(apierr.InvalidRequest, "sandbox_template.sandbox_template_id differs from the path's", []apierr.Violation{{Field: "sandbox_template.sandbox_template_id",
			Description: fmt.Sprintf("is %q, the template of the path is %s", id, cur.ID)}})
	}
	if r := in.GetRevision(); r != 0 && r != cur.Revision {
		return nil, etagMismatch(cur.ID, r, cur.Revision)
	}
	// What the template becomes: the current one with the masked fields of in.
	next, err := templateProto(cur)
	if err != nil {
		return nil, err
	}
	for _, path := range paths {
		switch name, sub, _ := strings.Cut(path, "."); {
		case path == "display_name":
			next.DisplayName = in.GetDisplayName()
		case path == "spec":
			next.Spec = in.GetSpec()
		case path == "attachments":
			next.Attachments = in.GetAttachments()
		case name == "spec":
			fd := specFields.ByName(protoreflect.Name(sub))
			dst := next.GetSpec().ProtoReflect()
			if src := in.GetSpec().ProtoReflect(); src.IsValid() && src.Has(fd) {
				dst.Set(fd, src.Get(fd))
			} else {
				dst.Clear(fd)
			}
		}
	}
	specBytes, attachments, err := s.checkTemplateFields(ctx, next)
	if err != nil {
		return nil, err
	}
	u := store.TemplateUpdate{DisplayName: &next.DisplayName, Spec: specBytes, Attachments: attachments, SetAttachments: true}
	t, err := st.Update(ctx, cur.Org, cur.ID, cur.Revision, u)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, templateNotFound(m.GetSandboxTemplateId())
	case errors.Is(err, store.ErrConflict):
		now, gerr := st.Get(ctx, cur.Org, cur.ID)
		if gerr != nil {
			return nil, templateNotFound(m.GetSandboxTemplateId())
		}
		return nil, etagMismatch(cur.ID, cur.Revision, now.Revision)
	case err != nil:
		return nil, s.templateWriteErr(err, next.DisplayName, nil)
	}
	s.log.Info("sandbox template updated", "template", t.ID, "org", t.Org, "revision", t.Revision)
	s.pokeWarm()
	return templateResponse(t)
}

func etagMismatch(id string, asked, current int64) error {
	return apierr.New(apierr.EtagMismatch, fmt.Sprintf("sandbox template %s is at revision %d, not %d: read it again", id, current, asked),
		map[string]string{"revision": strconv.FormatInt(asked, 10), "current_revision": strconv.FormatInt(current, 10)})
}

func (s *Server) DeleteSandboxTemplate(ctx context.Context, req *connect.Request[sandboxv1.DeleteSandboxTemplateRequest]) (*connect.Response[emptypb.Empty], error) {
	st, err := s.templatesStore()
	if err != nil {
		return nil, err
	}
	if err := requireAdmin(ctx, "DeleteSandboxTemplate"); err != nil {
		return nil, err
	}
	cur, err := s.resolveTemplate(ctx, "sandbox_template_id", req.Msg.GetSandboxTemplateId(), false)
	if err != nil {
		return nil, err
	}
	if _, err := st.Delete(ctx, cur.Org, cur.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, templateNotFound(req.Msg.GetSandboxTemplateId())
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	s.log.Info("sandbox template deleted", "template", cur.ID, "org", cur.Org)
	s.pokeWarm()
	return connect.NewResponse(&emptypb.Empty{}), nil
}

// CreateSandboxFromTemplate resolves the template (not deleted), merges the overrides
// (spec.FromTemplate) and creates through the one create path; the sandbox records the
// template's ID and revision, and its spec is the resolved one.
func (s *Server) CreateSandboxFromTemplate(ctx context.Context, req *connect.Request[sandboxv1.CreateSandboxFromTemplateRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	m := req.Msg
	if vs := requestIDViolations("request_id", m.GetRequestId()); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid request_id: "+apierr.Describe(vs), vs)
	}
	t, err := s.resolveTemplate(ctx, "template_id", m.GetTemplateId(), false)
	if err != nil {
		if out, ok := s.replayFromTemplate(ctx, m, err); ok {
			return connect.NewResponse(out), nil
		}
		return nil, err
	}
	tmpl := &sandboxv1.PartialSandboxSpec{}
	if err := proto.Unmarshal(t.Spec, tmpl); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("template %s: decode spec: %w", t.ID, err))
	}
	if n := proto.Size(m.GetOverrides()); n > MaxTemplateSpecBytes {
		return nil, apierr.Invalid(apierr.InvalidRequest, "overrides too large", []apierr.Violation{{Field: "overrides", Description: fmt.Sprintf("is %d bytes serialized, at most %d allowed", n, MaxTemplateSpecBytes)}})
	}
	// Set-but-empty lists and maps (JSON only: apifront.TakeCleared) clear the template's;
	// other unknown fields are ignored, as everywhere on binary protobuf.
	over := proto.CloneOf(m.GetOverrides())
	cleared := apifront.TakeCleared(over)
	over = discardUnknown(over)
	resolved, err := spec.FromTemplate(tmpl, over, cleared...)
	if err != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid overrides", []apierr.Violation{{Field: "overrides", Description: err.Error()}})
	}
	d := fromTemplateDigest(t.ID, over, cleared, m.GetDisplayName())
	out, err := s.create(ctx, createArgs{spec: resolved, requestID: m.GetRequestId(), requestDigest: d,
		sourceTemplateID: t.ID, sourceTemplateRevision: t.Revision, displayName: m.GetDisplayName(), displayNameField: "display_name"})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// fromTemplateDigest is a CreateSandboxFromTemplate request's identity for request_id
// replays: the template (by ID, whichever way it was named), the overrides (unknown
// fields dropped) with the fields they clear, and the display name.
func fromTemplateDigest(templateID string, over *sandboxv1.PartialSandboxSpec, cleared []protoreflect.Name, displayName string) string {
	names := make([]string, len(cleared))
	for i, n := range cleared {
		names[i] = string(n)
	}
	slices.Sort(names)
	// The cleared fields ride in RequestId, which the digest otherwise leaves out.
	return digest("from-template", &sandboxv1.CreateSandboxFromTemplateRequest{TemplateId: templateID, Overrides: over, DisplayName: displayName,
		RequestId: strings.Join(names, ",")})
}

// replayFromTemplate answers a repeated request_id whose template is gone (deleted since
// the first create, which stands): when the request names the template by ID and is the
// same request, the first sandbox.
func (s *Server) replayFromTemplate(ctx context.Context, m *sandboxv1.CreateSandboxFromTemplateRequest, resolveErr error) (*sandboxv1.Sandbox, bool) {
	id := strings.ToLower(m.GetTemplateId())
	if m.GetRequestId() == "" || connect.CodeOf(resolveErr) != connect.CodeNotFound || !uuidShape.MatchString(id) {
		return nil, false
	}
	rec, ok := s.index.byRequestID(ctx, principal(ctx).Org, m.GetRequestId())
	if !ok || rec.sourceTemplateID != id {
		return nil, false
	}
	over := proto.CloneOf(m.GetOverrides())
	cleared := apifront.TakeCleared(over)
	if rec.requestDigest != fromTemplateDigest(id, discardUnknown(over), cleared, m.GetDisplayName()) {
		return nil, false
	}
	r := s.runnerByID(s.index.runnerOf(rec))
	if r == nil {
		return nil, false
	}
	return s.created(rec, s.current(ctx, rec, r), r), true
}
