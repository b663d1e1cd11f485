package sandbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestSDKPollBackoff(t *testing.T) {
	b := newPollBackoff()
	var got []time.Duration
	for range 8 {
		got = append(got, b.next())
	}
	want := []time.Duration{200, 300, 450, 675, 1012, 1518, 2000, 2000}
	for i, w := range want {
		if d := got[i] - w*time.Millisecond; d < -time.Millisecond || d > time.Millisecond {
			t.Fatalf("intervals %v, want ≈ %v ms", got, want)
		}
	}
}

func TestSDKCollectPages(t *testing.T) {
	pages := map[string][]int{"": {1, 2}, "a": {3}, "b": {4, 5}}
	next := map[string]string{"": "a", "a": "b", "b": ""}
	var calls []string
	got, err := collectPages(context.Background(), 10, func(_ context.Context, tok string) ([]int, string, error) {
		calls = append(calls, tok)
		return pages[tok], next[tok], nil
	})
	if err != nil || !slices.Equal(got, []int{1, 2, 3, 4, 5}) || !slices.Equal(calls, []string{"", "a", "b"}) {
		t.Fatalf("got %v after %q, err %v", got, calls, err)
	}

	// A server repeating a token must not loop forever.
	_, err = collectPages(context.Background(), 10, func(_ context.Context, tok string) ([]int, string, error) {
		return []int{1}, "same", nil
	})
	if err == nil || !strings.Contains(err.Error(), "repeated") {
		t.Errorf("repeated token: %v", err)
	}
	n := 0
	_, err = collectPages(context.Background(), 3, func(_ context.Context, tok string) ([]int, string, error) {
		n++
		return nil, fmt.Sprint(n), nil
	})
	if err == nil || n != 3 {
		t.Errorf("page cap: %d calls, err %v", n, err)
	}
	boom := errors.New("boom")
	if _, err := collectPages(context.Background(), 3, func(context.Context, string) ([]int, string, error) { return nil, "", boom }); !errors.Is(err, boom) {
		t.Errorf("fetch error: %v", err)
	}
}

func apiError(code connect.Code, reason string, meta map[string]string, extra ...any) error {
	err := connect.NewError(code, errors.New("the message"))
	d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta})
	err.AddDetail(d)
	for _, x := range extra {
		switch v := x.(type) {
		case *errdetails.BadRequest:
			d, _ := connect.NewErrorDetail(v)
			err.AddDetail(d)
		case *errdetails.RetryInfo:
			d, _ := connect.NewErrorDetail(v)
			err.AddDetail(d)
		}
	}
	return err
}

func TestSDKErrorTyping(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		is   []error
		not  []error
	}{
		{"sandbox not found", apiError(connect.CodeNotFound, ReasonSandboxNotFound, nil), []error{ErrNotFound}, []error{ErrFileNotFound, ErrUnauthenticated}},
		{"file not found", apiError(connect.CodeNotFound, ReasonFileNotFound, map[string]string{"filepath": "/x"}), []error{ErrFileNotFound}, []error{ErrNotFound}},
		{"bare not found", connect.NewError(connect.CodeNotFound, errors.New("gone")), []error{ErrNotFound}, nil},
		{"unauthenticated", apiError(connect.CodeUnauthenticated, ReasonUnauthenticated, nil), []error{ErrUnauthenticated}, []error{ErrNotFound}},
		{"permission denied", connect.NewError(connect.CodePermissionDenied, errors.New("no")), []error{ErrUnauthenticated}, nil},
		{"not running", apiError(connect.CodeFailedPrecondition, ReasonSandboxNotRunning, nil), []error{ErrNotRunning}, nil},
		{"too large", apiError(connect.CodeResourceExhausted, ReasonFileTooLarge, nil), []error{ErrFileTooLarge, ErrResourceExhausted}, nil},
		{"unavailable", apiError(connect.CodeUnavailable, ReasonRunnerUnavailable, nil), []error{ErrUnavailable}, nil},
		{"invalid", apiError(connect.CodeInvalidArgument, ReasonInvalidRequest, nil), []error{ErrInvalidArgument}, nil},
		{"unimplemented", apiError(connect.CodeUnimplemented, ReasonNotImplemented, nil), []error{ErrUnimplemented}, nil},
	} {
		err := fromRPC(tc.err)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: %T is not *Error", tc.name, err)
		}
		for _, s := range tc.is {
			if !errors.Is(err, s) {
				t.Errorf("%s: not errors.Is %v", tc.name, s)
			}
		}
		for _, s := range tc.not {
			if errors.Is(err, s) {
				t.Errorf("%s: errors.Is %v", tc.name, s)
			}
		}
	}

	err := fromRPC(apiError(connect.CodeInvalidArgument, ReasonInvalidRequest, map[string]string{"k": "v"},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "sandbox.spec.image", Description: "is required"}}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(3 * time.Second)}))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatal(err)
	}
	if e.Code != connect.CodeInvalidArgument || e.Reason != ReasonInvalidRequest || e.Domain != ErrorDomain || e.Metadata["k"] != "v" ||
		len(e.Violations) != 1 || e.Violations[0].Field != "sandbox.spec.image" || e.RetryDelay != 3*time.Second {
		t.Errorf("parsed %+v", e)
	}
	if got := e.Error(); got != "the message: sandbox.spec.image is required" {
		t.Errorf("message %q", got)
	}
	if ReasonOf(fmt.Errorf("wrapped: %w", err)) != ReasonInvalidRequest {
		t.Error("ReasonOf does not see through wrapping")
	}

	se := &StateError{ID: "x", State: StateFailed, Reason: "ImagePullFailed: nope"}
	if !errors.Is(se, ErrSandboxFailed) || errors.Is(se, ErrSandboxTerminated) || !strings.Contains(se.Error(), "failed: ImagePullFailed") {
		t.Errorf("state error %v", se)
	}
}

func TestSDKRetry(t *testing.T) {
	n := 0
	err := retry(context.Background(), 5*time.Second, func(context.Context) error {
		n++
		if n < 3 {
			return fromRPC(connect.NewError(connect.CodeUnavailable, errors.New("later")))
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Errorf("transient: %d calls, %v", n, err)
	}
	n = 0
	err = retry(context.Background(), 5*time.Second, func(context.Context) error {
		n++
		return fromRPC(connect.NewError(connect.CodeNotFound, errors.New("gone")))
	})
	if n != 1 || !errors.Is(err, ErrNotFound) {
		t.Errorf("fatal: %d calls, %v", n, err)
	}
	// The server's RetryInfo wins over the backoff, capped at 10 s.
	if d := retryDelay(&Error{RetryDelay: time.Minute}, time.Second); d != maxRetryDelay {
		t.Errorf("retry delay %v", d)
	}
	if d := retryDelay(&Error{}, time.Second); d < 800*time.Millisecond || d > 1200*time.Millisecond {
		t.Errorf("jittered delay %v", d)
	}
}

func TestSDKSpecProto(t *testing.T) {
	p := Spec{}.Proto()
	c := p.GetContainers()[0]
	if c.GetName() != "main" || c.GetImage() != DefaultImage || c.GetCommand() != DefaultCommand || !slices.Equal(c.GetArgs(), DefaultArgs) {
		t.Errorf("default spec %v", p)
	}
	p = Spec{
		Image: "busybox", Args: []string{"echo", "hi"}, Env: map[string]string{"A": "1"}, WorkingDir: "/w",
		Files: map[string][]byte{"/b": []byte("b"), "/a": []byte("a")}, CPU: "500m", Memory: "256Mi",
		Lifetime: 90500 * time.Millisecond, Tags: []string{"t"}, RunnerIDs: []string{"r"},
	}.Proto()
	c = p.GetContainers()[0]
	if c.GetCommand() != "" || !slices.Equal(c.GetArgs(), []string{"echo", "hi"}) || c.GetEnvironmentVariables()["A"] != "1" || c.GetWorkingDir() != "/w" {
		t.Errorf("container %v", c)
	}
	if len(c.GetFiles()) != 2 || c.GetFiles()[0].GetPath() != "/a" {
		t.Errorf("files %v", c.GetFiles())
	}
	rr := c.GetResourceRequirements()
	if rr.GetRequests().GetCpu() != "500m" || rr.GetLimits().GetMemory() != "256Mi" {
		t.Errorf("resources %v", rr)
	}
	if p.GetMaxLifetimeSeconds() != 91 || p.GetTags()[0] != "t" || p.GetRunnerIds()[0] != "r" || p.GetMode() == 0 {
		t.Errorf("spec %v", p)
	}
}

func TestSDKBaseURL(t *testing.T) {
	for raw, ok := range map[string]bool{
		"http://127.0.0.1:8080": true, "https://api.cwsandbox.com/": true,
		"ftp://x": false, "http://": false, "http://h/path": false, "127.0.0.1:8080": false,
	} {
		if _, err := parseBaseURL(raw); (err == nil) != ok {
			t.Errorf("%q: %v", raw, err)
		}
	}
	t.Setenv(EnvBaseURL, "http://localhost:1")
	t.Setenv(EnvAPIKey, "k")
	c, err := FromEnv()
	if err != nil || c.BaseURL() != "http://localhost:1" {
		t.Errorf("FromEnv: %v %v", c, err)
	}
	// No endpoint anywhere is an error, never a default host.
	t.Setenv(EnvBaseURL, "")
	if c, err := New("", "k"); !errors.Is(err, ErrNoBaseURL) {
		t.Errorf("New without an endpoint: %v, %v", c, err)
	}
	if _, err := New("https://x", "", WithCAFile("/no/such/ca.pem")); err == nil {
		t.Error("a missing CA file is accepted")
	}
}

func TestSDKStateAndHelpers(t *testing.T) {
	if StateRunning.String() != "running" || StateTerminated.String() != "terminated" || !StateFailed.Terminal() || StateTerminating.Terminal() {
		t.Error("state names")
	}
	if s, err := ParseState("Completed"); err != nil || s != StateCompleted {
		t.Errorf("parse: %v %v", s, err)
	}
	if _, err := ParseState("bogus"); err == nil {
		t.Error("bogus state parsed")
	}
	if got := shellJoin([]string{"echo", "it's", "a b", "x=1"}); got != `echo 'it'\''s' 'a b' x=1` {
		t.Errorf("shellJoin %s", got)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(newUUID()) || newUUID() == "" {
		t.Error("uuid")
	}
}
