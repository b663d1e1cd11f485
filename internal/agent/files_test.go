package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
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
		// The streamed calls, over what the unary ones wrote: the same bytes both ways.
		back, size0, err := streamRead(ctx, h.client, &agentv1.ReadFileRequest{Path: path})
		if err != nil || !bytes.Equal(back, data) || size0 != int64(size) {
			t.Fatalf("stream read %d: %d bytes, size %d, %v", size, len(back), size0, err)
		}
		slices.Reverse(data)
		if err := streamWrite(ctx, h.client, &agentv1.WriteFileRequest{Path: path, Content: data, Mode: 0o600}); err != nil {
			t.Fatalf("stream write %d: %v", size, err)
		}
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("stream write %d: file has %d bytes, %v", size, len(got), err)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Errorf("stream write: mode %v", fi.Mode())
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
		{name: "read FIFO", read: &agentv1.ReadFileRequest{Path: "fifo"}, code: connect.CodeFailedPrecondition, reason: apierr.FileNotRegular},
		{name: "read socket", read: &agentv1.ReadFileRequest{Path: "sock"}, code: connect.CodeFailedPrecondition, reason: apierr.FileNotRegular},
		{name: "read device", read: &agentv1.ReadFileRequest{Path: "/dev/null"}, code: connect.CodeFailedPrecondition, reason: apierr.FileNotRegular},
		{name: "write the agent's socket", write: &agentv1.WriteFileRequest{Path: "/.sandboxd/run/agent.sock"}, code: connect.CodeInvalidArgument, reason: apierr.InvalidPath},
		{name: "write the agent's dir", write: &agentv1.WriteFileRequest{Path: "//.sandboxd"}, code: connect.CodeInvalidArgument, reason: apierr.InvalidPath},
		{name: "name too long", write: &agentv1.WriteFileRequest{Path: strings.Repeat("n", 300)}, code: connect.CodeInvalidArgument, reason: apierr.InvalidPath},
	}
	if err := syscall.Mkfifo(filepath.Join(wd, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(wd, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
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
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			for _, streamed := range []bool{false, true} {
				var err error
				switch {
				case tc.read != nil && streamed:
					_, _, err = streamRead(ctx, h.client, tc.read)
				case tc.read != nil:
					_, err = h.client.ReadFile(ctx, connect.NewRequest(tc.read))
				case streamed:
					err = streamWrite(ctx, h.client, tc.write)
				default:
					_, err = h.client.WriteFile(ctx, connect.NewRequest(tc.write))
				}
				if connect.CodeOf(err) != tc.code {
					t.Fatalf("streamed %v: err = %v, want %v", streamed, err, tc.code)
				}
				info := errInfo(t, err)
				if info.Reason != tc.reason || info.Domain != apierr.Domain || info.Metadata["filepath"] == "" && tc.name != "empty" {
					t.Errorf("streamed %v: info = %v", streamed, info)
				}
				for k, v := range tc.meta {
					if info.Metadata[k] != v {
						t.Errorf("streamed %v: metadata %s = %q, want %q", streamed, k, info.Metadata[k], v)
					}
				}
			}
		})
	}
}

// TestReadFIFODoesNotBlock: a FIFO without a writer is refused at once, every time, and
// leaves no call behind (today's bug: each call held an agent thread until its deadline).
func TestReadFIFODoesNotBlock(t *testing.T) {
	h := startAgent(t, longMain())
	fifo := filepath.Join(h.workDir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		_, err := h.client.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{Path: fifo}))
		cancel()
		if apierr.Reason(err) != apierr.FileNotRegular || connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("call %d: %v, want FAILED_PRECONDITION %s", i, err, apierr.FileNotRegular)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Fatalf("call %d took %s", i, d)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if after := runtime.NumGoroutine(); after > before+10 {
		t.Errorf("goroutines %d before, %d after 50 reads", before, after)
	}
	res, err := h.client.Exec(context.Background(), connect.NewRequest(&agentv1.ExecRequest{Command: []string{"echo", "alive"}}))
	if err != nil || string(res.Msg.GetStdout()) != "alive\n" {
		t.Fatalf("exec after the reads: %v %q", err, res.Msg.GetStdout())
	}
}

// TestFileErrorCodes: the errnos of read-only and busy paths are typed, never INTERNAL.
func TestFileErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		errno  syscall.Errno
		code   connect.Code
		reason string
	}{
		{syscall.EROFS, connect.CodePermissionDenied, apierr.FilePermissionDenied},
		{syscall.EBUSY, connect.CodePermissionDenied, apierr.FilePermissionDenied}, // rename over a bind mount (/etc/hosts)
		{syscall.ETXTBSY, connect.CodePermissionDenied, apierr.FilePermissionDenied},
		{syscall.EACCES, connect.CodePermissionDenied, apierr.FilePermissionDenied},
		{syscall.ENXIO, connect.CodeFailedPrecondition, apierr.FileNotRegular},
		{syscall.EISDIR, connect.CodeFailedPrecondition, apierr.FileIsDirectory},
		{syscall.ENAMETOOLONG, connect.CodeInvalidArgument, apierr.InvalidPath},
		{syscall.EIO, connect.CodeInternal, apierr.FileIOFailed},
	} {
		err := fileError("write", "/etc/hosts", &fs.PathError{Op: "rename", Path: "/etc/hosts", Err: tc.errno})
		if connect.CodeOf(err) != tc.code || apierr.Reason(err) != tc.reason || apierr.Info(err).GetMetadata()["filepath"] != "/etc/hosts" {
			t.Errorf("%v: %v (reason %s), want %v %s", tc.errno, err, apierr.Reason(err), tc.code, tc.reason)
		}
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

// streamWrite writes req by WriteFileStream, in chunks of FileChunkBytes, the size
// declared as len(req.Content).
func streamWrite(ctx context.Context, c agentv1connect.AgentServiceClient, req *agentv1.WriteFileRequest) error {
	return streamWriteSized(ctx, c, req, int64(len(req.Content)))
}

func streamWriteSized(ctx context.Context, c agentv1connect.AgentServiceClient, req *agentv1.WriteFileRequest, size int64) error {
	st := c.WriteFileStream(ctx)
	data := req.Content
	n := min(len(data), FileChunkBytes)
	err := st.Send(&agentv1.WriteFileChunk{Path: req.Path, Mode: req.Mode, Size: size, Content: data[:n]})
	for data = data[n:]; err == nil && len(data) > 0; data = data[n:] {
		n = min(len(data), FileChunkBytes)
		err = st.Send(&agentv1.WriteFileChunk{Content: data[:n]})
	}
	if _, cerr := st.CloseAndReceive(); cerr != nil {
		return cerr
	}
	return err
}

// streamRead reads by ReadFileStream: the content and the size of the first message.
func streamRead(ctx context.Context, c agentv1connect.AgentServiceClient, req *agentv1.ReadFileRequest) ([]byte, int64, error) {
	st, err := c.ReadFileStream(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, 0, err
	}
	defer st.Close()
	var out []byte
	var size int64
	msgs := 0
	for st.Receive() {
		if msgs == 0 {
			size = st.Msg().GetSize()
		} else if st.Msg().GetSize() != 0 {
			return nil, 0, fmt.Errorf("message %d has size %d", msgs, st.Msg().GetSize())
		}
		if len(st.Msg().GetContent()) > FileChunkBytes {
			return nil, 0, fmt.Errorf("message %d has %d bytes", msgs, len(st.Msg().GetContent()))
		}
		out = append(out, st.Msg().GetContent()...)
		msgs++
	}
	if err := st.Err(); err != nil {
		return nil, 0, err
	}
	if msgs == 0 {
		return nil, 0, errors.New("no message")
	}
	return out, size, nil
}

// TestWriteFileStreamSize: a stream of more or fewer bytes than its declared size, or a
// size out of range, is INVALID_ARGUMENT and leaves the file as it was, with no temp
// file; so does a stream the caller abandons.
func TestWriteFileStreamSize(t *testing.T) {
	h := startAgent(t, longMain())
	ctx := context.Background()
	path := filepath.Join(h.workDir, "f")
	if err := os.WriteFile(path, []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 3*FileChunkBytes+5)
	for _, tc := range []struct {
		name string
		size int64
	}{
		{"short", int64(len(data)) + 1},
		{"long", int64(len(data)) - 1},
		{"long in the first chunk", 1},
		{"negative", -1},
		{"over the maximum", maxFileBytes + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := streamWriteSized(ctx, h.client, &agentv1.WriteFileRequest{Path: path, Content: data}, tc.size)
			if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
				t.Fatalf("err = %v, want INVALID_ARGUMENT %s", err, apierr.InvalidRequest)
			}
			assertUntouched(t, path)
		})
	}
	t.Run("no message", func(t *testing.T) {
		st := h.client.WriteFileStream(ctx)
		if _, err := st.CloseAndReceive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
		}
	})
	t.Run("abandoned", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		st := h.client.WriteFileStream(cctx)
		if err := st.Send(&agentv1.WriteFileChunk{Path: path, Size: int64(len(data)), Content: data[:FileChunkBytes]}); err != nil {
			t.Fatal(err)
		}
		cancel()
		_, _ = st.CloseAndReceive()
		// The agent notices the reset stream; poll until its temp file is gone.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) && tempFiles(h.workDir) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		assertUntouched(t, path)
	})
}

func tempFiles(dir string) int {
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			n++
		}
	}
	return n
}

func assertUntouched(t *testing.T, path string) {
	t.Helper()
	if b, err := os.ReadFile(path); err != nil || string(b) != "before" {
		t.Errorf("file = %q, %v; want it untouched", b, err)
	}
	if n := tempFiles(filepath.Dir(path)); n > 0 {
		t.Errorf("%d temp files left", n)
	}
}
