package apierr

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
)

// bad holds bytes that are not UTF-8, as a caller's path, name or header can.
const bad = "a\xffb\xe2\x82"

func TestInvalidUTF8KeepsDetails(t *testing.T) {
	for name, err := range map[string]*connect.Error{
		"New":     New(RouteNotFound, "no route "+bad, map[string]string{"path": bad, bad: "key"}),
		"Invalid": Invalid(InvalidRequest, "bad "+bad, []Violation{{Field: "spec.tags[" + bad + "]", Description: "is " + bad}}),
		"foreign+WithViolations": WithViolations(connect.NewError(connect.CodeInvalidArgument, errors.New("bad "+bad)),
			[]Violation{{Field: "f", Description: bad}}),
		"foreign+WithRetry": WithRetry(connect.NewError(connect.CodeUnavailable, errors.New("down "+bad)), 0),
	} {
		t.Run(name, func(t *testing.T) {
			if !utf8.ValidString(err.Message()) {
				t.Errorf("message %q is not UTF-8", err.Message())
			}
			if len(err.Details()) == 0 {
				t.Fatal("no details: one failed to marshal and was dropped")
			}
			for _, d := range err.Details() {
				if _, derr := d.Value(); derr != nil {
					t.Errorf("detail %s: %v", d.Type(), derr)
				}
			}
		})
	}
	err := New(RouteNotFound, "x", map[string]string{"path": bad})
	if got := Info(err).GetMetadata()["path"]; got != "a\uFFFDb\uFFFD" {
		t.Errorf("metadata path = %q, want the bad bytes replaced", got)
	}
	err = Invalid(InvalidRequest, "x", []Violation{{Field: bad, Description: bad}})
	if vs := Violations(err); len(vs) != 1 || vs[0].Field != "a\uFFFDb\uFFFD" || vs[0].Description != vs[0].Field {
		t.Errorf("violations %q, want one with the bad bytes replaced", vs)
	}
}

// TestInvalidUTF8OnTheWire: a handler returning such an error gives the client the
// error's code, reason and violations on gRPC and Connect; a status message that is
// not UTF-8 made the gRPC status fail to marshal (INTERNAL), and a violation that is not
// made the BadRequest vanish.
func TestInvalidUTF8OnTheWire(t *testing.T) {
	const procedure = "/test.v1.Test/Call"
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(_ context.Context, _ *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
			return nil, Invalid(InvalidRequest, "spec.name "+bad+" is not a DNS label",
				[]Violation{{Field: "spec.name", Description: strings.Repeat("é", 3) + bad}})
		}))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	for name, opt := range map[string]connect.ClientOption{"gRPC": connect.WithGRPC(), "Connect": connect.WithProtoJSON(), "gRPC-Web": connect.WithGRPCWeb()} {
		t.Run(name, func(t *testing.T) {
			c := connect.NewClient[emptypb.Empty, emptypb.Empty](srv.Client(), srv.URL+procedure, opt)
			_, err := c.CallUnary(t.Context(), connect.NewRequest(&emptypb.Empty{}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || Reason(err) != InvalidRequest {
				t.Fatalf("got %v (reason %q), want INVALID_ARGUMENT %s", err, Reason(err), InvalidRequest)
			}
			if vs := Violations(err); len(vs) != 1 || vs[0].Field != "spec.name" || !utf8.ValidString(vs[0].Description) {
				t.Errorf("violations %q", vs)
			}
		})
	}
}

// TestValidMessageKeepsTheRest: an error apierr did not make, whose message is not UTF-8,
// keeps its code, details and metadata when a detail is added.
func TestValidMessageKeepsTheRest(t *testing.T) {
	foreign := connect.NewError(connect.CodeFailedPrecondition, errors.New("no "+bad))
	foreign.Meta().Set("X-Kept", "yes")
	foreign = WithRetry(foreign, 0)
	err := WithViolations(foreign, []Violation{{Field: "f", Description: "d"}})
	if err.Code() != connect.CodeFailedPrecondition || err.Message() != "no a\uFFFDb\uFFFD" || err.Meta().Get("X-Kept") != "yes" {
		t.Errorf("got %v %q meta %v", err.Code(), err.Message(), err.Meta())
	}
	if RetryInfo(err) == nil || len(Violations(err)) != 1 {
		t.Errorf("details %v", err.Details())
	}
}
