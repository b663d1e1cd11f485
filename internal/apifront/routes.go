package apifront

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Route is one REST binding (google.api.http) of a method: "GET /v1/sandboxes/{sandbox_id}".
type Route struct {
	Method string
	// Template is the binding's path template, e.g. "/v1/sandboxes/{sandbox_id}:exec".
	Template string
	// segs are the template's path segments; a variable's is "" with its field in vars.
	segs []string
	vars map[int]string // segment index -> field path (e.g. "managed_runner.runner_id")
	verb string         // ":exec" of ".../{sandbox_id}:exec", or ""
	// input is the method's request message; body the binding's body ("" for none).
	input protoreflect.MessageDescriptor
	body  string
}

// Routes returns the REST bindings of the services' methods, additional bindings included.
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
				rt.input = md.Input()
				out = append(out, rt)
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
	rt := Route{Method: method, Template: tmpl, vars: map[int]string{}, body: r.GetBody()}
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

// match returns the first route with method whose template the request's path fits, and
// its path variables (field path -> value); nil when none does.
func match(routes []Route, method string, r *http.Request) (*Route, map[string]string) {
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
next:
	for k := range routes {
		rt := &routes[k]
		if rt.Method != method || len(rt.segs) != len(segs) {
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
		return rt, vars
	}
	return nil, nil
}

// routeREST finds the route of a REST request and checks what the transcoder would
// otherwise refuse with a bare or a 500 answer: a path no route has (NOT_FOUND, 404), a
// method the path does not take (405), a query parameter that names no field of the
// request (INVALID_ARGUMENT with a violation per parameter), a body where the route takes
// none (of known length). It returns the route and its path variables.
func routeREST(routes []Route, r *http.Request) (*Route, map[string]string, error) {
	rt, vars := match(routes, r.Method, r)
	if rt == nil {
		return nil, nil, noRoute(routes, r)
	}
	if vs := unknownParams(rt, r.URL.Query()); len(vs) > 0 {
		return nil, nil, apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("unknown query parameter(s) for %s %s", rt.Method, rt.Template), vs)
	}
	if vs := notUTF8(vars, r.URL.Query()); len(vs) > 0 {
		return nil, nil, apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("%s %s: path variables and query values must be UTF-8", rt.Method, rt.Template), vs)
	}
	if rt.body == "" && r.ContentLength > 0 {
		return nil, nil, errNoBody(rt)
	}
	return rt, vars, nil
}

// notUTF8 returns a violation for every path variable and query value that is not UTF-8
// (a percent-encoded byte such as %FF): they become protobuf strings, which must be, and
// the transcoder answered 500 UNKNOWN for them, where a JSON body's is INVALID_ARGUMENT.
func notUTF8(vars map[string]string, q url.Values) []apierr.Violation {
	var vs []apierr.Violation
	for field, v := range vars {
		if !utf8.ValidString(v) {
			vs = append(vs, apierr.Violation{Field: field, Description: "must be UTF-8"})
		}
	}
	for name, values := range q {
		for _, v := range values {
			if !utf8.ValidString(v) {
				vs = append(vs, apierr.Violation{Field: textclip.Clip(name, 128), Description: "must be UTF-8"})
				break
			}
		}
	}
	slices.SortFunc(vs, func(a, b apierr.Violation) int { return strings.Compare(a.Field, b.Field) })
	return vs[:min(len(vs), maxUnknownFields)]
}

// noRoute is 405 (with Allow) when other methods take the path, else NOT_FOUND.
func noRoute(routes []Route, r *http.Request) error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if rt, _ := match(routes, m, r); rt != nil {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		return errNoRoute(r)
	}
	a, path := strings.Join(allow, ", "), textclip.Clip(r.URL.Path, 128)
	return restStatus{http.StatusMethodNotAllowed, a, apierr.New(apierr.NotImplemented,
		fmt.Sprintf("%s does not take %s; it takes %s", path, textclip.Clip(r.Method, 128), a),
		map[string]string{"method": textclip.Clip(r.Method, 128), "path": path, "allow": a})}
}

func errNoBody(rt *Route) error {
	return apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("%s %s takes no request body; its fields go in the path and query", rt.Method, rt.Template),
		[]apierr.Violation{{Field: "body", Description: "must be empty"}})
}

// restStatus is an error answered with another HTTP status than its code's (405), and
// the Allow header.
type restStatus struct {
	status int
	allow  string
	err    *connect.Error
}

func (e restStatus) Error() string { return e.err.Error() }
func (e restStatus) Unwrap() error { return e.err }

// unknownParams returns a violation for every query parameter that is not a field path
// of the route's request message, resolved as the transcoder does: each dotted element a
// field's JSON or proto name, every element but the last a singular message.
//
// Parameters are the request's fields only: system parameters of other APIs ($alt, alt,
// fields, $callback, …) are refused as well, since this server answers only JSON and
// whole messages, and ignoring one would answer something else than asked.
// At most maxUnknownFields are named.
func unknownParams(rt *Route, q url.Values) []apierr.Violation {
	var unknown []string
	for name := range q {
		if !isFieldPath(rt.input, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	desc := fmt.Sprintf("is not a query parameter of %s %s; it takes %s", rt.Method, rt.Template, paramNames(rt))
	vs := make([]apierr.Violation, 0, min(len(unknown), maxUnknownFields))
	for _, name := range unknown[:min(len(unknown), maxUnknownFields)] {
		vs = append(vs, apierr.Violation{Field: textclip.Clip(name, 128), Description: desc})
	}
	return vs
}

func isFieldPath(md protoreflect.MessageDescriptor, path string) bool {
	parts := strings.Split(path, ".")
	for i, p := range parts {
		fd := md.Fields().ByJSONName(p)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(p))
		}
		if fd == nil {
			return false
		}
		if i == len(parts)-1 {
			return true
		}
		if fd.IsList() || fd.IsMap() || fd.Message() == nil {
			return false
		}
		md = fd.Message()
	}
	return false
}

// paramNames lists the request's top-level fields a query parameter can set (scalars,
// enums and their lists), but those of the path and the body.
func paramNames(rt *Route) string {
	if rt.body == "*" {
		return "none (the body is the whole request)"
	}
	var names []string
	fields := rt.input.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := string(fd.Name())
		if fd.Message() != nil || fd.IsMap() || name == rt.body || slices.Contains(slices.Collect(maps.Values(rt.vars)), name) {
			continue
		}
		names = append(names, fd.JSONName())
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// RawRoute is a REST route served by a plain handler rather than a service method: its
// body is taken whole (as bytes, not JSON) and it takes no query parameter.
func RawRoute(method, template string) Route {
	rt, err := parseRule(&annotations.HttpRule{Pattern: &annotations.HttpRule_Custom{Custom: &annotations.CustomHttpPattern{Kind: method, Path: template}}, Body: "*"})
	if err != nil {
		// The templates are compiled in: a programming error.
		panic(fmt.Sprintf("apifront: route %s %s: %v", method, template, err))
	}
	rt.input = (&emptypb.Empty{}).ProtoReflect().Descriptor()
	return rt
}
