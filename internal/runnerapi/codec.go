package runnerapi

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxReplyElements bounds the elements of one message a gateway takes from a runner
// (every field occurrence, every element of a packed list, every message): decoded, a
// message costs far more memory than its bytes on the wire (an empty sandbox in a List
// reply is 2 bytes on the wire, ~300 in memory), so MaxMessageBytes alone let one reply
// of a runner (an organization's own) make the gateway allocate ~150 times that
// (~19 GiB). With the bound a reply decodes to a few hundred MiB at most.
const MaxReplyElements = 1 << 20

// errTooManyElements: a runner's message holds more than MaxReplyElements elements.
var errTooManyElements = fmt.Errorf("a message of more than %d elements", MaxReplyElements)

// boundedCodec is the protobuf codec of the gateway's clients of a runner: it refuses
// a message of more than MaxReplyElements elements before decoding it.
type boundedCodec struct{}

func (boundedCodec) Name() string { return "proto" }

func (boundedCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("runnerapi: %T is not a protobuf message", m)
	}
	return proto.Marshal(pm)
}

func (boundedCodec) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("runnerapi: %T is not a protobuf message", m)
	}
	if _, err := countElements(b, pm.ProtoReflect().Descriptor(), MaxReplyElements); err != nil {
		return err
	}
	return proto.Unmarshal(b, pm)
}

// countElements counts the elements of b, a message of md, down through its messages;
// more than budget is errTooManyElements. Bytes that are no valid message are left to
// proto.Unmarshal to refuse.
func countElements(b []byte, md protoreflect.MessageDescriptor, budget int) (int, error) {
	n := 1 // the message itself
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return n, nil
		}
		b = b[l:]
		n++
		var fd protoreflect.FieldDescriptor
		if md != nil {
			fd = md.Fields().ByNumber(num)
		}
		if typ != protowire.BytesType {
			l = protowire.ConsumeFieldValue(num, typ, b)
			if l < 0 {
				return n, nil
			}
			b = b[l:]
		} else {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return n, nil
			}
			b = b[l:]
			switch {
			case fd != nil && (fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind):
				k, err := countElements(v, fd.Message(), budget-n)
				n += k
				if err != nil {
					return n, err
				}
			case fd != nil && fd.IsList(): // packed: at most one element a byte
				n += len(v)
			}
		}
		if n > budget {
			return n, errTooManyElements
		}
	}
	return n, nil
}

// tooManyElements reports whether err is a runner's message refused for its elements.
func tooManyElements(err error) bool { return errors.Is(err, errTooManyElements) }
