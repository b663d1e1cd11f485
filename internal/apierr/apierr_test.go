package apierr

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		code   connect.Code
		reason string
		meta   map[string]string
		vs     []Violation
	}{
		{"reason and metadata", New(connect.CodeNotFound, FileNotFound, "no such file", map[string]string{"filepath": "/x"}),
			connect.CodeNotFound, FileNotFound, map[string]string{"filepath": "/x"}, nil},
		{"wrapped", fmt.Errorf("relay: %w", Newf(connect.CodeFailedPrecondition, SandboxNotRunning, "sandbox %s is %s", "a", "FAILED")),
			connect.CodeFailedPrecondition, SandboxNotRunning, nil, nil},
		{"violations", Invalid(InvalidRequest, "bad spec", []Violation{{"spec.a", "is required"}, {"spec.b", "must be positive"}}),
			connect.CodeInvalidArgument, InvalidRequest, nil, []Violation{{"spec.a", "is required"}, {"spec.b", "must be positive"}}},
		{"plain error has no reason", errors.New("boom"), connect.CodeUnknown, "", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := connect.CodeOf(tc.err); got != tc.code {
				t.Errorf("code %v, want %v", got, tc.code)
			}
			if got := Reason(tc.err); got != tc.reason {
				t.Errorf("reason %q, want %q", got, tc.reason)
			}
			for k, v := range tc.meta {
				if got := Info(tc.err).GetMetadata()[k]; got != v {
					t.Errorf("metadata %s = %q, want %q", k, got, v)
				}
			}
			if got := Violations(tc.err); fmt.Sprint(got) != fmt.Sprint(tc.vs) {
				t.Errorf("violations %v, want %v", got, tc.vs)
			}
		})
	}
}

func TestWithRetry(t *testing.T) {
	err := WithRetry(New(connect.CodeResourceExhausted, "CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED", "full", nil), 3*time.Second)
	var found bool
	for _, d := range err.Details() {
		v, _ := d.Value()
		if ri, ok := v.(*errdetails.RetryInfo); ok {
			found = ri.GetRetryDelay().AsDuration() == 3*time.Second
		}
	}
	if !found {
		t.Error("RetryInfo with 3s delay missing")
	}
}
