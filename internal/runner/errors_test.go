package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestAPIError(t *testing.T) {
	verr := &ValidationError{Violations: []apierr.Violation{
		{Field: "spec.containers[0].image", Description: "is required"},
		{Field: "sandbox_id", Description: "is bad"},
	}}
	agentErr := apierr.New(apierr.FileNotFound, "/x: no such file", nil)
	for _, tc := range []struct {
		name   string
		err    error
		code   connect.Code
		reason string
		meta   string // sandbox_id
	}{
		{"not found", fmt.Errorf("%w: abc", runtime.ErrNotFound), connect.CodeNotFound, apierr.SandboxNotFound, "abc"},
		{"not running", fmt.Errorf("%w: abc is FAILED", ErrNotRunning), connect.CodeFailedPrecondition, apierr.SandboxNotRunning, "abc"},
		{"already exists", fmt.Errorf("%w: abc", ErrAlreadyExists), connect.CodeAlreadyExists, "", ""},
		{"api error passes", fmt.Errorf("read: %w", agentErr), connect.CodeNotFound, apierr.FileNotFound, ""},
		{"canceled", fmt.Errorf("start: %w", context.Canceled), connect.CodeCanceled, "", ""},
		{"deadline", fmt.Errorf("start: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded, "", ""},
		{"anything else", errors.New("disk on fire"), connect.CodeInternal, "", ""},
	} {
		err := APIError("abc", tc.err, SpecField)
		if connect.CodeOf(err) != tc.code || apierr.Reason(err) != tc.reason || apierr.Info(err).GetMetadata()["sandbox_id"] != tc.meta {
			t.Errorf("%s: %v (reason %q, metadata %v), want %v %q sandbox_id=%q", tc.name, err, apierr.Reason(err), apierr.Info(err).GetMetadata(), tc.code, tc.reason, tc.meta)
		}
	}
	if APIError("abc", nil, SpecField) != nil {
		t.Error("APIError(nil) is not nil")
	}
	// The public API names the spec inside the request's sandbox; RunnerService keeps
	// the runner's names. Fields outside the spec stay as they are.
	for prefix, want := range map[string]string{SpecField: "[sandbox.spec.containers[0].image sandbox_id]", "": "[spec.containers[0].image sandbox_id]"} {
		err := APIError("abc", verr, prefix)
		var fields []string
		for _, v := range apierr.Violations(err) {
			fields = append(fields, v.Field)
		}
		if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest || fmt.Sprint(fields) != want {
			t.Errorf("prefix %q: %v fields %v, want %s", prefix, err, fields, want)
		}
	}
	if err := APIError("", fmt.Errorf("%w: x", runtime.ErrNotFound), ""); apierr.Info(err).GetMetadata() != nil {
		t.Errorf("no id, yet metadata %v", apierr.Info(err).GetMetadata())
	}
}

// TestContainerNotFoundClipsNames: a name that is no valid container name (huge, not
// UTF-8) is quoted clipped to 64 bytes of valid UTF-8, in the message and the metadata;
// a valid one as it is.
func TestContainerNotFoundClipsNames(t *testing.T) {
	for _, name := range []string{strings.Repeat("a", 100<<10), "\xff\xfe" + strings.Repeat("\x80", 100<<10)} {
		api := APIError("sb", &ContainerNotFoundError{Sandbox: "sb", Container: name}, SpecField)
		if connect.CodeOf(api) != connect.CodeNotFound || apierr.Reason(api) != apierr.ContainerNotFound {
			t.Fatalf("unknown container: %v", api)
		}
		md := apierr.Info(api).GetMetadata()["container"]
		if len(md) > 64 || !utf8.ValidString(md) || len(api.Error()) > 300 || !utf8.ValidString(api.Error()) {
			t.Errorf("name quoted as %d bytes (valid %v), message %d bytes", len(md), utf8.ValidString(md), len(api.Error()))
		}
	}
	api := APIError("sb", &ContainerNotFoundError{Sandbox: "sb", Container: "cache"}, SpecField)
	if apierr.Info(api).GetMetadata()["container"] != "cache" || !strings.Contains(api.Error(), `"cache"`) {
		t.Errorf("valid name: %v", api)
	}
}
