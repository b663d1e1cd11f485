package agent

import (
	"bytes"
	"context"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
)

// errInfo is err's ErrorInfo in the cwsandbox.com domain; the test fails without one.
func errInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	info := apierr.Info(err)
	if info == nil {
		t.Fatalf("no cwsandbox.com ErrorInfo in %v", err)
	}
	return info
}

func TestFilesRoundTrip(t *testing.T) {
	h := startAgent(t, longMain())
	ctx := context.Background()
	for _, size := range []int{0, 1, 10 << 20, 40 << 20} {
		data := make([]byte, size)
		r := rand.New(rand.NewPCG(uint64(size), 1))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		path := filepath.Join(h.workDir, "a/b/c", strings.Repeat("x", size%7+1))
		if _, err := h.client.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: path, Content: data})); err != nil {
			t.Fatalf("write %d: %v", size, err)
		}
		res, err := h.client.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: path}))
		if err != nil {
			t.Fatalf("read %d: %v", size, err)
		}
		if !bytes.Equal(res.Msg.Content, data) {
			t.Fatalf("size %d: content differs (got %d bytes)", size, len(res.Msg.Content))
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
			t.Errorf("mode %v", fi.Mode())
		}
	}
	// Relative paths resolve against the working dir; mode is applied.
	if _, err := h.client.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{Path: "rel/x.sh", Content: []byte("#!/bin/sh\necho hi\n"), Mode: 0o755})); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(h.workDir, "rel/x.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("stat: %v %v", fi, err)
	}
	res, err := h.client.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"./rel/x.sh"}}))
	if err != nil || string(res.Msg.Stdout) != "hi\n" {
		t.Fatalf("exec written script: %v %v", res, err)
	}
	// No temp files left behind.
	ents, _ := os.ReadDir(filepath.Join(h.workDir, "a/b/c"))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temp file left: %s", e.Name())
		}
	}
}

func TestFileErrors(t *testing.T) {
	h := startAgent(t, longMain())
	ctx := context.Background()
	wd := h.workDir
	os.WriteFile(filepath.Join(wd, "file"), []byte("0123456789"), 0o644)
	os.Mkdir(filepath.Join(wd, "dir"), 0o755)
	tests := []struct {
		name   string
		read   *agentv1.ReadFileRequest
		write  *agentv1.WriteFileRequest
		code   connect.Code
		reason string
		meta   map[string]string
	}{
		{name: "read not found", read: &agentv1.ReadFileRequest{Path: "/no/such/file"}, code: connect.CodeNotFound, reason: apierr.FileNotFound,
			meta: map[string]string{"filepath": "/no/such/file"}},
		{name: "read dir", read: &agentv1.ReadFileRequest{Path: "dir"}, code: connect.CodeFailedPrecondition, reason: apierr.FileIsDirectory},
		{name: "write dir", write: &agentv1.WriteFileRequest{Path: "dir"}, code: connect.CodeFailedPrecondition, reason: apierr.FileIsDirectory},
		// Parent is a regular file: ENOTDIR, reported as not found.
		{name: "read under file", read: &agentv1.ReadFileRequest{Path: "file/x"}, code: connect.CodeNotFound, reason: apierr.FileNotFound},
		{name: "write under file", write: &agentv1.WriteFileRequest{Path: "file/x"}, code: connect.CodeNotFound, reason: apierr.FileNotFound},
		{name: "too large", read: &agentv1.ReadFileRequest{Path: "file", MaxBytes: 5}, code: connect.CodeResourceExhausted, reason: apierr.FileTooLarge,
			meta: map[string]string{"filepath": "file", "size_bytes": "10", "max_size_bytes": "5"}},
		{name: "traversal", read: &agentv1.ReadFileRequest{Path: "/etc/../etc/passwd"}, code: connect.CodeInvalidArgument, reason: apierr.InvalidPath},
		{name: "relative traversal", write: &agentv1.WriteFileRequest{Path: "../x"}, code: connect.CodeInvalidArgument, reason: apierr.InvalidPath},
		{name: "NUL", read: &agentv1.ReadFileRequest{Path: "fi\x00le"}, code: connect.CodeInvalidArgument, reason: apierr.InvalidPath},
		{name: "empty", write: &agentv1.WriteFileRequest{Path: ""}, code: connect.CodeInvalidArgument, reason: apierr.InvalidPath},
	}
	if os.Getuid() != 0 {
		// Root ignores file modes; as root, cmd/sandbox-agent's TestPermissionDenied runs the
		// agent as nobody instead.
		os.WriteFile(filepath.Join(wd, "secret"), nil, 0o000)
		tests = append(tests,
			struct {
				name   string
				read   *agentv1.ReadFileRequest
				write  *agentv1.WriteFileRequest
				code   connect.Code
				reason string
				meta   map[string]string
			}{name: "permission", read: &agentv1.ReadFileRequest{Path: "secret"}, code: connect.CodePermissionDenied, reason: apierr.FilePermissionDenied})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.read != nil {
				_, err = h.client.ReadFile(ctx, connect.NewRequest(tc.read))
			} else {
				_, err = h.client.WriteFile(ctx, connect.NewRequest(tc.write))
			}
			if connect.CodeOf(err) != tc.code {
				t.Fatalf("err = %v, want %v", err, tc.code)
			}
			info := errInfo(t, err)
			if info.Reason != tc.reason || info.Domain != apierr.Domain || info.Metadata["filepath"] == "" && tc.name != "empty" {
				t.Errorf("info = %v", info)
			}
			for k, v := range tc.meta {
				if info.Metadata[k] != v {
					t.Errorf("metadata %s = %q, want %q", k, info.Metadata[k], v)
				}
			}
		})
	}
}

func FuzzValidatePath(f *testing.F) {
	for _, s := range []string{"/a/b", "a/../b", "..", "/..", "a/..", "a\x00b", "", "/a/b/..c", "...", "./x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := ValidatePath(p)
		if err != nil {
			return
		}
		if strings.IndexByte(p, 0) >= 0 || p == "" {
			t.Fatalf("accepted %q", p)
		}
		// An accepted path never escapes its base.
		base := "/base/dir"
		j := filepath.Join(base, p)
		if !filepath.IsAbs(p) && j != base && !strings.HasPrefix(j, base+"/") {
			t.Fatalf("%q escapes: %q", p, j)
		}
		if filepath.IsAbs(p) && strings.Contains(filepath.Clean(p), "..") && strings.Contains(p, "/../") {
			t.Fatalf("%q has traversal", p)
		}
	})
}
