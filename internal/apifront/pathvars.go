package apifront

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// Route is one REST binding (google.api.http) of a method: "GET /v1/sandboxes/{sandbox_id}".
type Route struct {
	Method string
	// segs are the template's path segments; a variable's is "" with its field in vars.
	segs []string
	vars map[int]string // segment index -> field path (e.g. "managed_runner.runner_id")
	verb string         // ":exec" of ".../{sandbox_id}:exec", or ""
}

// Routes returns the REST bindings with path variables of the services' methods.
func Routes(svcs ...protoreflect.ServiceDescriptor) ([]Route, error) {
	var out []Route
	for _, sd := range svcs {
		for i := range sd.Methods().Len() {
			md := sd.Methods().Get(i)
			rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
			if rule == nil {
				continue
			}
			for _, r := range append([]*annotations.HttpRule{rule}, rule.GetAdditionalBindings()...) {
				rt, err := parseRule(r)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", md.FullName(), err)
				}
				if len(rt.vars) > 0 {
					out = append(out, rt)
				}
			}
		}
	}
	return out, nil
}

// ClientStreaming returns the RPC paths (/package.Service/Method) of the services'
// client- and bidi-streaming methods: their request bodies last as long as the call.
func ClientStreaming(svcs ...protoreflect.ServiceDescriptor) []string {
	var out []string
	for _, sd := range svcs {
		for i := range sd.Methods().Len() {
			if md := sd.Methods().Get(i); md.IsStreamingClient() {
				out = append(out, "/"+string(sd.FullName())+"/"+string(md.Name()))
			}
		}
	}
	return out
}

func parseRule(r *annotations.HttpRule) (Route, error) {
	var method, tmpl string
	switch p := r.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		method, tmpl = http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		method, tmpl = http.MethodPost, p.Post
	case *annotations.HttpRule_Put:
		method, tmpl = http.MethodPut, p.Put
	case *annotations.HttpRule_Patch:
		method, tmpl = http.MethodPatch, p.Patch
	case *annotations.HttpRule_Delete:
		method, tmpl = http.MethodDelete, p.Delete
	case *annotations.HttpRule_Custom:
		method, tmpl = p.Custom.GetKind(), p.Custom.GetPath()
	default:
		return Route{}, fmt.Errorf("HTTP rule without a pattern")
	}
	rt := Route{Method: method, vars: map[int]string{}}
	if i := strings.LastIndexByte(tmpl, ':'); i > strings.LastIndexByte(tmpl, '}') && i > strings.LastIndexByte(tmpl, '/') {
		tmpl, rt.verb = tmpl[:i], tmpl[i:]
	}
	for i, s := range strings.Split(strings.TrimPrefix(tmpl, "/"), "/") {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
			field, pat, _ := strings.Cut(s[1:len(s)-1], "=")
			if pat != "" && pat != "*" {
				return Route{}, fmt.Errorf("path template %q: only single-segment variables are supported", tmpl)
			}
			rt.vars[i] = field
			s = ""
		}
		rt.segs = append(rt.segs, s)
	}
	return rt, nil
}

// sortRoutes puts routes with a verb first: "/v1/sandboxes/x:exec" is the :exec route,
// not GET /v1/sandboxes/{sandbox_id} of "x:exec".
func sortRoutes(rs []Route) []Route {
	rs = slices.Clone(rs)
	slices.SortStableFunc(rs, func(a, b Route) int {
		switch {
		case a.verb != "" && b.verb == "":
			return -1
		case a.verb == "" && b.verb != "":
			return 1
		}
		return 0
	})
	return rs
}

// matchVars returns the path variables of the first route r matches (field path ->
// value), or nil.
func matchVars(routes []Route, r *http.Request) map[string]string {
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
next:
	for _, rt := range routes {
		if rt.Method != r.Method || len(rt.segs) != len(segs) {
			continue
		}
		last := segs[len(segs)-1]
		if rt.verb != "" {
			var ok bool
			if last, ok = strings.CutSuffix(last, rt.verb); !ok {
				continue
			}
		}
		vars := map[string]string{}
		for i, s := range segs {
			if i == len(segs)-1 {
				s = last
			}
			field, isVar := rt.vars[i]
			if !isVar {
				if s != rt.segs[i] {
					continue next
				}
				continue
			}
			v, err := url.PathUnescape(s)
			if err != nil || v == "" {
				continue next
			}
			vars[field] = v
		}
		return vars
	}
	return nil
}

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
