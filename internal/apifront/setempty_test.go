package apifront

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

func TestSetEmptyOverrides(t *testing.T) {
	for _, tc := range []struct {
		body, want string
	}{
		{`{"templateId": "t", "overrides": {"tags": [], "annotations": {}, "runner_ids": [ ], "containers": [{"name": "m"}]}}`, "[tags annotations runner_ids]"},
		{`{"templateId": "t", "overrides": {"tags": ["a"], "maxLifetimeSeconds": 0}}`, "[]"},
		{`{"templateId": "t"}`, "[]"},
		{`{"templateId": "t", "overrides": null}`, "[]"},
		{`{"templateId": "t", "overrides": {"network": {}}}`, "[]"}, // a message, not a map: present already
	} {
		msg := &sandboxv1.CreateSandboxFromTemplateRequest{}
		markSetEmpty([]byte(tc.body), msg)
		got := TakeCleared(msg.GetOverrides())
		seen := map[string]bool{}
		for _, n := range got {
			seen[string(n)] = true
		}
		var ordered []string
		for _, n := range []string{"tags", "annotations", "runner_ids"} {
			if seen[n] {
				ordered = append(ordered, n)
			}
		}
		if fmt.Sprint(len(got)) != fmt.Sprint(len(ordered)) || fmt.Sprintf("%v", ordered) != tc.want && !(tc.want == "[]" && len(ordered) == 0) {
			t.Errorf("%s: cleared %v, want %s", tc.body, got, tc.want)
		}
		if len(msg.GetOverrides().ProtoReflect().GetUnknown()) != 0 {
			t.Errorf("%s: unknown fields left", tc.body)
		}
	}
	// Another message is left alone.
	other := &sandboxv1.CreateSandboxRequest{}
	markSetEmpty([]byte(`{"sandbox": {"spec": {"tags": []}}}`), other)
	if len(other.ProtoReflect().GetUnknown()) != 0 || other.GetSandbox() != nil {
		t.Errorf("CreateSandboxRequest changed: %v", other)
	}
}

// FuzzTakeCleared: any unknown bytes are taken apart without panic and dropped.
func FuzzTakeCleared(f *testing.F) {
	f.Add(protowire.AppendString(protowire.AppendTag(nil, ClearedFieldNumber, protowire.BytesType), "tags"))
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &sandboxv1.PartialSandboxSpec{}
		m.ProtoReflect().SetUnknown(b)
		_ = TakeCleared(m)
		if len(m.ProtoReflect().GetUnknown()) != 0 || !proto.Equal(m, &sandboxv1.PartialSandboxSpec{}) {
			t.Fatal("unknown fields left")
		}
	})
}
