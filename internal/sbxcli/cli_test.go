package sbxcli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

func TestSbxFormatError(t *testing.T) {
	code := 3
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&sandbox.Error{Code: connect.CodeNotFound, Reason: "CWSANDBOX_SANDBOX_NOT_FOUND", Message: "sandbox x not found"}, "sbx: sandbox x not found (CWSANDBOX_SANDBOX_NOT_FOUND)"},
		{fmt.Errorf("delete x: %w", &sandbox.Error{Code: connect.CodeUnavailable, Message: "connection refused"}), "sbx: delete x: connection refused (UNAVAILABLE)"},
		{&sandbox.Error{Code: connect.CodeInvalidArgument, Reason: "CWSANDBOX_INVALID_REQUEST", Message: "invalid sandbox spec",
			Violations: []sandbox.Violation{{Field: "image", Description: "is required"}}}, "sbx: invalid sandbox spec: image is required (CWSANDBOX_INVALID_REQUEST)"},
		{&sandbox.Error{Code: connect.CodeAborted, Reason: "STREAM_BACKPRESSURE"}, "sbx: aborted (STREAM_BACKPRESSURE)"},
		{&sandbox.StateError{ID: "x", State: sandbox.StateFailed, Reason: "ImagePullFailed: no such image", ExitCode: &code}, "sbx: sandbox x is failed: ImagePullFailed: no such image (exit code 3) (FAILED)"},
		{errors.New("-o must be text or json"), "sbx: -o must be text or json"},
		{context.Canceled, "sbx: interrupted"},
	} {
		if got := FormatError(tc.err); got != tc.want {
			t.Errorf("FormatError(%v)\n got %s\nwant %s", tc.err, got, tc.want)
		}
	}
}

func TestSbxUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"get"},                    // missing ID
		{"ls", "-o", "yaml"},       // bad format
		{"run", "busybox", "--rm"}, // --rm without a command
		{"run", "busybox", "--egress", "everything"},
		{"run", "busybox", "--egress", "any", "--deny-egress"},
		{"nosuch"},
	} {
		var out, errb bytes.Buffer
		if code := Execute(args, nil, &out, &errb); code != 1 || !strings.HasPrefix(errb.String(), "sbx: ") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
	}
	// An unreachable endpoint is an error of the call, not a hang.
	var errb bytes.Buffer
	start := time.Now()
	code := Execute([]string{"--base-url", "http://127.0.0.1:1", "--api-key", "k", "ls"}, nil, &bytes.Buffer{}, &errb)
	if code != 1 || !strings.Contains(errb.String(), "(UNAVAILABLE)") || time.Since(start) > 40*time.Second {
		t.Errorf("unreachable: exit %d, stderr %q", code, errb.String())
	}
	if Execute([]string{"--help"}, nil, &bytes.Buffer{}, &bytes.Buffer{}) != 0 {
		t.Error("--help fails")
	}
}

func TestSbxParseHelpers(t *testing.T) {
	env, err := parseEnv([]string{"A=1", "B=x=y"})
	if err != nil || env["A"] != "1" || env["B"] != "x=y" {
		t.Errorf("env %v %v", env, err)
	}
	if _, err := parseEnv([]string{"=1"}); err == nil {
		t.Error("empty key accepted")
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got, _ := parseSince("5m", now); !got.Equal(now.Add(-5 * time.Minute)) {
		t.Errorf("since 5m = %v", got)
	}
	if got, _ := parseSince("2026-01-01T00:00:00Z", now); got.Year() != 2026 || got.Day() != 1 {
		t.Errorf("since time = %v", got)
	}
	if _, err := parseSince("yesterday", now); err == nil {
		t.Error("bad since accepted")
	}
}
