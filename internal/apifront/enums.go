package apifront

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// Enums is a connect interceptor that refuses, with INVALID_ARGUMENT and a field violation
// per field, a request holding an enum value its enum does not declare (state=99): an
// unknown filter would otherwise match nothing and answer an empty page.
type Enums struct{}

// UnknownEnums returns a violation for every enum field of m (at any depth) whose value
// its enum does not declare.
func UnknownEnums(m protoreflect.Message) []apierr.Violation {
	var vs []apierr.Violation
	walkEnums(m, "", &vs)
	return vs
}

func walkEnums(m protoreflect.Message, prefix string, vs *[]apierr.Violation) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := prefix + string(fd.Name())
		check := func(field string, v protoreflect.Value) {
			switch {
			case fd.Enum() != nil:
				if fd.Enum().Values().ByNumber(v.Enum()) == nil {
					*vs = append(*vs, apierr.Violation{Field: field, Description: fmt.Sprintf("%d is not a value of %s", v.Enum(), fd.Enum().FullName())})
				}
			case fd.Message() != nil:
				walkEnums(v.Message(), field+".", vs)
			}
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				check(fmt.Sprintf("%s[%d]", name, i), l.Get(i))
			}
		case fd.IsMap():
			if fd.MapValue().Enum() != nil || fd.MapValue().Message() != nil {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					field := fmt.Sprintf("%s[%q]", name, k.String())
					if e := fd.MapValue().Enum(); e != nil {
						if e.Values().ByNumber(mv.Enum()) == nil {
							*vs = append(*vs, apierr.Violation{Field: field, Description: fmt.Sprintf("%d is not a value of %s", mv.Enum(), e.FullName())})
						}
					} else {
						walkEnums(mv.Message(), field+".", vs)
					}
					return true
				})
			}
		default:
			check(name, v)
		}
		return true
	})
}

func checkEnums(msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	vs := UnknownEnums(m.ProtoReflect())
	if len(vs) == 0 {
		return nil
	}
	fields := make([]string, len(vs))
	for i, v := range vs {
		fields[i] = v.Field
	}
	return apierr.Invalid(apierr.InvalidRequest, "unknown enum value in "+strings.Join(fields, ", "), vs)
}

func (Enums) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := checkEnums(req.Any()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (Enums) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (Enums) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, enumConn{conn})
	}
}

type enumConn struct{ connect.StreamingHandlerConn }

func (c enumConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	return checkEnums(msg)
}
