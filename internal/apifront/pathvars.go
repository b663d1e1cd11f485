package apifront

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

type varsKey struct{}

// PathVars is a connect interceptor that refuses, with INVALID_ARGUMENT and a field
// violation, a REST request whose message holds another value than its URL path in a
// field the path sets: GET /v1/sandboxes/A?sandboxId=B acts on neither A nor B.
type PathVars struct{}

func checkVars(ctx context.Context, msg any) error {
	vars, _ := ctx.Value(varsKey{}).(map[string]string)
	m, ok := msg.(proto.Message)
	if len(vars) == 0 || !ok {
		return nil
	}
	var vs []apierr.Violation
	for field, want := range vars {
		if got, ok := fieldString(m.ProtoReflect(), field); !ok || got != want {
			vs = append(vs, apierr.Violation{Field: field,
				Description: fmt.Sprintf("is %q by the URL path; a query parameter or body field must not set it to another value", want)})
		}
	}
	if len(vs) == 0 {
		return nil
	}
	slices.SortFunc(vs, func(a, b apierr.Violation) int { return strings.Compare(a.Field, b.Field) })
	return apierr.Invalid(apierr.InvalidRequest, "a path variable is contradicted by the query or body", vs)
}

// fieldString returns the value of the (dotted) scalar field path of m as text.
func fieldString(m protoreflect.Message, path string) (string, bool) {
	names := strings.Split(path, ".")
	for i, n := range names {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(n))
		if fd == nil || fd.IsList() || fd.IsMap() {
			return "", false
		}
		if i < len(names)-1 {
			if fd.Message() == nil {
				return "", false
			}
			m = m.Get(fd).Message()
			continue
		}
		if fd.Message() != nil {
			return "", false
		}
		return m.Get(fd).String(), true
	}
	return "", false
}

func (PathVars) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := checkVars(ctx, req.Any()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (PathVars) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (PathVars) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if ctx.Value(varsKey{}) == nil {
			return next(ctx, conn)
		}
		return next(ctx, &checkedConn{StreamingHandlerConn: conn, ctx: ctx})
	}
}

// checkedConn checks every message received of a REST stream.
type checkedConn struct {
	connect.StreamingHandlerConn
	ctx context.Context
}

func (c *checkedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	return checkVars(c.ctx, msg)
}

func contextWithVars(ctx context.Context, vars map[string]string) context.Context {
	return context.WithValue(ctx, varsKey{}, vars)
}
