package spec

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// Merge applies overrides to a template's spec by the replace-on-presence rule of
// CreateSandboxFromTemplate, over every top-level field of PartialSandboxSpec by
// reflection (a field added to the message is merged too): a message that is set
// replaces the template's; a list or map that is not empty replaces the template's whole
// (containers too: never merged per container); a scalar or enum that is not zero
// replaces it; a proto3 optional field that is present replaces it. Everything else keeps
// the template's. cleared names top-level fields the caller set explicitly empty (a JSON
// `[]` or `{}`, which protobuf binary cannot carry): they are emptied. Neither input is
// changed.
func Merge(tmpl, overrides *sandboxv1.PartialSandboxSpec, cleared ...protoreflect.Name) (*sandboxv1.PartialSandboxSpec, error) {
	out := proto.CloneOf(tmpl)
	if out == nil {
		out = &sandboxv1.PartialSandboxSpec{}
	}
	m := out.ProtoReflect()
	fields := m.Descriptor().Fields()
	for _, name := range cleared {
		fd := fields.ByName(name)
		if fd == nil || !(fd.IsList() || fd.IsMap()) {
			return nil, fmt.Errorf("overrides.%s: only a list or map can be set empty", name)
		}
		m.Clear(fd)
	}
	if overrides != nil {
		proto.CloneOf(overrides).ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			// Range visits exactly the present fields: set messages, non-empty lists and
			// maps, non-zero scalars, present optionals.
			m.Set(fd, v)
			return true
		})
	}
	return out, nil
}

// FromTemplate is the sandbox spec a template's spec and a create's overrides resolve to
// (Merge, then ToSandboxSpec).
func FromTemplate(tmpl, overrides *sandboxv1.PartialSandboxSpec, cleared ...protoreflect.Name) (*sandboxv1.SandboxSpec, error) {
	p, err := Merge(tmpl, overrides, cleared...)
	if err != nil {
		return nil, err
	}
	return ToSandboxSpec(p)
}

// ToSandboxSpec converts a partial spec to a SandboxSpec by re-encoding it: both messages
// (and PartialContainer and Container) have the same fields under the same numbers and
// types (TestPartialSpecMatchesSpec), so the bytes of one are the other. An unknown field
// after decoding would mean they drifted apart: an error, never a dropped field.
func ToSandboxSpec(p *sandboxv1.PartialSandboxSpec) (*sandboxv1.SandboxSpec, error) {
	b, err := proto.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode partial spec: %w", err)
	}
	out := &sandboxv1.SandboxSpec{}
	if err := proto.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("decode partial spec as a spec: %w", err)
	}
	if len(out.ProtoReflect().GetUnknown()) > 0 {
		return nil, fmt.Errorf("partial spec has fields a spec has not")
	}
	for _, c := range out.GetContainers() {
		if len(c.ProtoReflect().GetUnknown()) > 0 {
			return nil, fmt.Errorf("partial container %q has fields a container has not", c.GetName())
		}
	}
	return out, nil
}
