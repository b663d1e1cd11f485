package apifront

import (
	"bytes"
	"encoding/json"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Set-but-empty lists and maps in JSON. CreateSandboxFromTemplate merges its overrides
// by replace-on-presence, where a list or map that is set replaces the template's even
// when empty. Protobuf binary cannot say "set but empty" (an empty list is not on the
// wire), but JSON can (`"tags": []`). The JSON codec records the top-level keys of such a
// message whose value is `[]` or `{}` as unknown fields of the message, numbered
// ClearedFieldNumber, each holding the field's name: they survive the transcoding to
// protobuf binary on the way to the handler, which takes them with TakeCleared.

// ClearedFieldNumber numbers the unknown fields that carry the names of set-but-empty
// fields: the highest field number there is, which no field of the API will take.
const ClearedFieldNumber protowire.Number = protowire.MaxValidNumber

// setEmptyFields are the messages (by request message and field) whose set-but-empty
// lists and maps the JSON codec records.
var setEmptyFields = map[protoreflect.FullName]protoreflect.Name{
	"coreweave.sandbox.v1.CreateSandboxFromTemplateRequest": "overrides",
}

// markSetEmpty records in msg the set-but-empty fields of b (the JSON msg was decoded from).
func markSetEmpty(b []byte, msg proto.Message) {
	m := msg.ProtoReflect()
	name, ok := setEmptyFields[m.Descriptor().FullName()]
	if !ok {
		return
	}
	fd := m.Descriptor().Fields().ByName(name)
	if fd == nil || fd.Message() == nil {
		return
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return
	}
	raw, ok := top[fd.JSONName()]
	if !ok {
		raw, ok = top[string(fd.Name())]
	}
	if !ok {
		return
	}
	var inner map[string]json.RawMessage
	if json.Unmarshal(raw, &inner) != nil {
		return
	}
	fields := fd.Message().Fields()
	var unknown []byte
	for key, v := range inner {
		f := fields.ByJSONName(key)
		if f == nil {
			f = fields.ByTextName(key)
		}
		if f == nil || !(f.IsList() || f.IsMap()) {
			continue
		}
		if !(f.IsList() && isEmptyArray(v)) && !(f.IsMap() && isEmptyObject(v)) {
			continue
		}
		unknown = protowire.AppendTag(unknown, ClearedFieldNumber, protowire.BytesType)
		unknown = protowire.AppendString(unknown, string(f.Name()))
	}
	if len(unknown) > 0 {
		sub := m.Mutable(fd).Message()
		sub.SetUnknown(append(sub.GetUnknown(), unknown...))
	}
}

func isEmptyArray(v []byte) bool {
	var a []json.RawMessage
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '[' && json.Unmarshal(v, &a) == nil && len(a) == 0
}

func isEmptyObject(v []byte) bool {
	var m map[string]json.RawMessage
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '{' && json.Unmarshal(v, &m) == nil && len(m) == 0
}

// TakeCleared returns the names of the set-but-empty fields recorded in msg and drops
// every unknown field of msg (binary clients may send fields this server does not know
// yet: ignored, as everywhere on binary protobuf).
func TakeCleared(msg proto.Message) []protoreflect.Name {
	m := msg.ProtoReflect()
	if !m.IsValid() {
		return nil
	}
	b := m.GetUnknown()
	var out []protoreflect.Name
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == ClearedFieldNumber && typ == protowire.BytesType {
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				break
			}
			b = b[n:]
			out = append(out, protoreflect.Name(v))
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			break
		}
		b = b[n:]
	}
	m.SetUnknown(nil)
	return out
}
