package apierr

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
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
		{"reason and metadata", New(FileNotFound, "no such file", map[string]string{"filepath": "/x"}),
			connect.CodeNotFound, FileNotFound, map[string]string{"filepath": "/x"}, nil},
		{"wrapped", fmt.Errorf("relay: %w", Newf(SandboxNotRunning, "sandbox %s is %s", "a", "FAILED")),
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
	err := WithRetry(New(RunnerCapacityExhausted, "full", nil), 3*time.Second)
	if ri := RetryInfo(err); ri.GetRetryDelay().AsDuration() != 3*time.Second {
		t.Errorf("RetryInfo %v, want a 3s delay", ri)
	}
	if ri := RetryInfo(New(FileIOFailed, "no retry", nil)); ri != nil {
		t.Errorf("RetryInfo of an error without one: %v", ri)
	}
}

func TestPageSize(t *testing.T) {
	for _, c := range []struct {
		got       int32
		want      int
		wantError bool
	}{{0, 10, false}, {1, 1, false}, {50, 50, false}, {51, 50, false}, {-1, 0, true}} {
		n, err := PageSize(c.got, 10, 50)
		if (err != nil) != c.wantError || n != c.want {
			t.Errorf("PageSize(%d) = %d, %v; want %d (error %v)", c.got, n, err, c.want, c.wantError)
		}
		if err != nil && (connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "page_size")) {
			t.Errorf("PageSize(%d) error = %v", c.got, err)
		}
	}
}
