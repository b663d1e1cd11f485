package spec

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// TestPartialSpecMatchesSpec: ToSandboxSpec re-encodes, so PartialSandboxSpec and
// PartialContainer must have exactly the fields of SandboxSpec and Container, under the
// same numbers, kinds and cardinalities (presence aside: runtime_class_selection is a
// proto3 optional in the partial form only; its encoding is the same).
func TestPartialSpecMatchesSpec(t *testing.T) {
	pairs := []struct {
		partial, full protoreflect.MessageDescriptor
	}{
		{(&sandboxv1.PartialSandboxSpec{}).ProtoReflect().Descriptor(), (&sandboxv1.SandboxSpec{}).ProtoReflect().Descriptor()},
		{(&sandboxv1.PartialContainer{}).ProtoReflect().Descriptor(), (&sandboxv1.Container{}).ProtoReflect().Descriptor()},
	}
	for _, p := range pairs {
		pf, ff := p.partial.Fields(), p.full.Fields()
		if pf.Len() != ff.Len() {
			t.Errorf("%s has %d fields, %s %d", p.partial.Name(), pf.Len(), p.full.Name(), ff.Len())
		}
		for i := range pf.Len() {
			a := pf.Get(i)
			b := ff.ByNumber(a.Number())
			if b == nil {
				t.Errorf("%s.%s (%d): %s has no field %d", p.partial.Name(), a.Name(), a.Number(), p.full.Name(), a.Number())
				continue
			}
			if a.Name() != b.Name() || a.Kind() != b.Kind() || a.Cardinality() != b.Cardinality() || a.IsMap() != b.IsMap() || a.IsPacked() != b.IsPacked() {
				t.Errorf("%s.%s differs from %s.%s", p.partial.Name(), a.Name(), p.full.Name(), b.Name())
			}
			if a.Message() != nil && !a.IsMap() && a.Message() != b.Message() && a.Message().FullName() != "coreweave.sandbox.v1.PartialContainer" {
				t.Errorf("%s.%s: message %s vs %s", p.partial.Name(), a.Name(), a.Message().FullName(), b.Message().FullName())
			}
		}
	}
}

// sample sets fd of m to a present value that depends on seed (1 or 2).
func sample(t *testing.T, m protoreflect.Message, fd protoreflect.FieldDescriptor, seed int) {
	t.Helper()
	s := string(rune('a' + seed))
	scalar := func(fd protoreflect.FieldDescriptor) protoreflect.Value {
		switch fd.Kind() {
		case protoreflect.StringKind:
			return protoreflect.ValueOfString(s)
		case protoreflect.Int32Kind:
			return protoreflect.ValueOfInt32(int32(seed))
		case protoreflect.EnumKind:
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(seed))
		case protoreflect.BoolKind:
			return protoreflect.ValueOfBool(true)
		}
		t.Fatalf("no sample of kind %s (%s): extend sample", fd.Kind(), fd.FullName())
		return protoreflect.Value{}
	}
	fill := func(sub protoreflect.Message) {
		// A message distinguishable by seed: its first string field (if any) says which.
		fs := sub.Descriptor().Fields()
		for i := range fs.Len() {
			if f := fs.Get(i); f.Kind() == protoreflect.StringKind && !f.IsList() && !f.IsMap() {
				sub.Set(f, protoreflect.ValueOfString(s))
				return
			}
		}
	}
	switch {
	case fd.IsMap():
		m.Mutable(fd).Map().Set(protoreflect.ValueOfString(s).MapKey(), protoreflect.ValueOfString(s))
	case fd.IsList():
		l := m.Mutable(fd).List()
		if fd.Kind() == protoreflect.MessageKind {
			e := l.NewElement()
			fill(e.Message())
			l.Append(e)
		} else {
			l.Append(scalar(fd))
		}
	case fd.Kind() == protoreflect.MessageKind:
		fill(m.Mutable(fd).Message())
	default:
		m.Set(fd, scalar(fd))
	}
}

// TestMergeCoversEveryField: for every field of PartialSandboxSpec (a field added later
// included), an override that sets it wins and one that does not keeps the template's,
// and no other field moves.
func TestMergeCoversEveryField(t *testing.T) {
	fields := (&sandboxv1.PartialSandboxSpec{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		t.Run(string(fd.Name()), func(t *testing.T) {
			tmpl, over := &sandboxv1.PartialSandboxSpec{}, &sandboxv1.PartialSandboxSpec{}
			for j := range fields.Len() {
				sample(t, tmpl.ProtoReflect(), fields.Get(j), 1)
			}
			sample(t, over.ProtoReflect(), fd, 2)
			got, err := Merge(tmpl, over)
			if err != nil {
				t.Fatal(err)
			}
			for j := range fields.Len() {
				g := fields.Get(j)
				want := tmpl
				if g == fd {
					want = over
				}
				if !fieldEqual(got, want, g) {
					t.Errorf("field %s after overriding %s: not the expected value", g.Name(), fd.Name())
				}
			}
			// Not set: the template's, for this field and every other.
			kept, err := Merge(tmpl, &sandboxv1.PartialSandboxSpec{})
			if err != nil || !proto.Equal(kept, tmpl) {
				t.Errorf("empty overrides changed the template: %v", err)
			}
			if _, err := ToSandboxSpec(got); err != nil {
				t.Error(err)
			}
		})
	}
}

// fieldEqual: field fd of a and of b are equal.
func fieldEqual(a, b *sandboxv1.PartialSandboxSpec, fd protoreflect.FieldDescriptor) bool {
	only := func(m *sandboxv1.PartialSandboxSpec) proto.Message {
		c := proto.CloneOf(m)
		c.ProtoReflect().Range(func(f protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			if f != fd {
				c.ProtoReflect().Clear(f)
			}
			return true
		})
		return c
	}
	return proto.Equal(only(a), only(b))
}

func TestMergeRules(t *testing.T) {
	tmpl := &sandboxv1.PartialSandboxSpec{
		Containers: []*sandboxv1.PartialContainer{
			{Name: "main", Image: "python:3.11", Command: "sleep", Args: []string{"inf"}, EnvironmentVariables: map[string]string{"A": "1"},
				ImagePullCredentials: &sandboxv1.ImagePullCredentials{}},
			{Name: "side", Image: "busybox"},
		},
		Tags:                  []string{"t1", "t2"},
		MaxLifetimeSeconds:    600,
		Network:               &sandboxv1.NetworkOptions{},
		Annotations:           map[string]string{"k": "v"},
		RuntimeClassSelection: sandboxv1.RuntimeClass_RUNTIME_CLASS_CPU_NESTED_VIRT.Enum(),
	}
	// Containers replace whole: the override's one container, nothing of the template's.
	got, err := FromTemplate(tmpl, &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: "alpine"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Containers) != 1 || got.Containers[0].GetImage() != "alpine" || got.Containers[0].GetCommand() != "" || got.Containers[0].GetEnvironmentVariables() != nil {
		t.Errorf("containers = %v", got.Containers)
	}
	// A scalar zero keeps; a non-zero replaces; tags replace whole.
	got, _ = FromTemplate(tmpl, &sandboxv1.PartialSandboxSpec{Tags: []string{"x"}})
	if got.GetMaxLifetimeSeconds() != 600 || len(got.GetTags()) != 1 || got.GetTags()[0] != "x" || got.GetContainers()[0].GetImagePullCredentials() == nil {
		t.Errorf("merged = %v", got)
	}
	// A present optional replaces even with zero.
	got, _ = FromTemplate(tmpl, &sandboxv1.PartialSandboxSpec{RuntimeClassSelection: sandboxv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED.Enum()})
	if got.GetRuntimeClassSelection() != sandboxv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED {
		t.Errorf("runtime_class_selection = %v", got.GetRuntimeClassSelection())
	}
	if got, _ = FromTemplate(tmpl, nil); got.GetRuntimeClassSelection() != sandboxv1.RuntimeClass_RUNTIME_CLASS_CPU_NESTED_VIRT {
		t.Errorf("runtime_class_selection = %v", got.GetRuntimeClassSelection())
	}
	// Set-but-empty (JSON): cleared.
	got, err = FromTemplate(tmpl, &sandboxv1.PartialSandboxSpec{}, "tags", "annotations")
	if err != nil || got.GetTags() != nil || got.GetAnnotations() != nil || got.GetMaxLifetimeSeconds() != 600 {
		t.Errorf("cleared = %v, %v", got, err)
	}
	if _, err := Merge(tmpl, nil, "max_lifetime_seconds"); err == nil {
		t.Error("clearing a scalar: no error")
	}
	if _, err := Merge(tmpl, nil, "nope"); err == nil {
		t.Error("clearing an unknown field: no error")
	}
	if len(tmpl.Containers) != 2 || len(tmpl.Tags) != 2 {
		t.Error("the template changed")
	}
}

// FuzzMerge: any two partial specs merge without panic, the result is a valid
// SandboxSpec encoding, and each top-level field is the override's when present there
// and the template's otherwise.
func FuzzMerge(f *testing.F) {
	seed := func(m proto.Message) []byte { b, _ := proto.Marshal(m); return b }
	f.Add(seed(&sandboxv1.PartialSandboxSpec{Tags: []string{"a"}, MaxLifetimeSeconds: 5}), seed(&sandboxv1.PartialSandboxSpec{Tags: []string{"b"}}))
	f.Add(seed(&sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "m", Image: "i"}}}), []byte{})
	f.Add([]byte{}, seed(&sandboxv1.PartialSandboxSpec{RuntimeClassSelection: sandboxv1.RuntimeClass_RUNTIME_CLASS_UNSPECIFIED.Enum()}))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		tmpl, over := &sandboxv1.PartialSandboxSpec{}, &sandboxv1.PartialSandboxSpec{}
		if proto.Unmarshal(a, tmpl) != nil || proto.Unmarshal(b, over) != nil {
			return
		}
		// Unknown fields are the gateway's to refuse; here known fields only.
		proto.Reset(tmpl)
		_ = proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(a, tmpl)
		proto.Reset(over)
		_ = proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, over)
		got, err := Merge(tmpl, over)
		if err != nil {
			t.Fatal(err)
		}
		fields := got.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			want := tmpl
			if over.ProtoReflect().Has(fd) {
				want = over
			}
			if !fieldEqual(got, want, fd) {
				t.Fatalf("field %s", fd.Name())
			}
		}
		if _, err := ToSandboxSpec(got); err != nil {
			t.Fatal(err)
		}
	})
}
