package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// unaryCap is the largest file sent or read by unary RPC; a server reporting a smaller
// cap in CWSANDBOX_FILE_TOO_LARGE metadata lowers it for this sandbox.
func (s *Sandbox) unaryCap() int64 {
	if v := s.fileCap.Load(); v > 0 {
		return v
	}
	return MaxUnaryFileBytes
}

// WriteFile creates or overwrites path (parent directories included) with data, in the
// handle's container (see InContainer; default the primary). Up to
// 32 MiB go by unary WriteFile; larger files, or a server that refuses the size, are
// streamed through exec (`cat` into the file, size checked), like the official client.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	if len(data) > MaxFileBytes {
		return fmt.Errorf("sandbox: %s: %d bytes is more than the %d bytes a write takes", path, len(data), MaxFileBytes)
	}
	if err := s.ensureRunning(ctx); err != nil {
		return err
	}
	if int64(len(data)) <= s.unaryCap() {
		dc, err := s.data(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_WRITE_FILE)
		if err != nil {
			return err
		}
		cctx, cancel := withTimeout(ctx, fileTimeout)
		_, err = dc.WriteFile(cctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: s.id, Path: path, Content: data, Container: s.container}))
		cancel()
		err = fromRPC(err)
		if err == nil || !s.noteTooLarge(err, false) {
			return err
		}
	}
	return s.streamWrite(ctx, path, data)
}

// ReadFile returns the content of path in the handle's container (see InContainer;
// default the primary). Files beyond the unary cap are streamed
// through exec (`cat`) when the server reports their size.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	if err := s.ensureRunning(ctx); err != nil {
		return nil, err
	}
	dc, err := s.data(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_READ_FILE)
	if err != nil {
		return nil, err
	}
	cctx, cancel := withTimeout(ctx, fileTimeout)
	res, err := dc.ReadFile(cctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: s.id, Path: path, Container: s.container}))
	cancel()
	if err == nil {
		return res.Msg.GetContent(), nil
	}
	err = fromRPC(err)
	if !s.noteTooLarge(err, true) {
		return nil, err
	}
	var e *Error
	if errors.As(err, &e) && e.Metadata["size_bytes"] != "" {
		if n, perr := strconv.ParseInt(e.Metadata["size_bytes"], 10, 64); perr == nil && n > MaxFileBytes {
			return nil, err
		}
	}
	return s.streamRead(ctx, path)
}

// noteTooLarge reports whether err asks for the streaming fallback, remembering the
// server's cap.
func (s *Sandbox) noteTooLarge(err error, read bool) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	if e.Reason == ReasonFileTooLarge {
		if n, perr := strconv.ParseInt(e.Metadata["max_size_bytes"], 10, 64); perr == nil && n > 0 {
			s.fileCap.Store(n)
		}
		return true
	}
	if e.Code == connect.CodeResourceExhausted && e.Reason == "" {
		return read || strings.Contains(e.Message, "larger than max")
	}
	return false
}

// Exit codes of the streaming scripts.
const (
	exitNotFound    = 2
	exitIsDirectory = 3
)

const writeScript = `set -e
mkdir -p "$(dirname "$1")"
cat > "$1"
n=$(wc -c < "$1")
[ $n -eq "$2" ] || { echo "wrote $n of $2 bytes" >&2; exit 4; }`

const readScript = `[ -e "$1" ] || exit 2
[ -d "$1" ] && exit 3
exec cat "$1"`

func (s *Sandbox) streamWrite(ctx context.Context, path string, data []byte) error {
	var stderr bytes.Buffer
	code, err := s.Exec(ctx, []string{"/bin/sh", "-c", writeScript, "sh", path, strconv.Itoa(len(data))},
		ExecOptions{Stdin: bytes.NewReader(data), Stderr: &stderr})
	if err != nil {
		return err
	}
	if code != 0 {
		return &Error{Code: connect.CodeInternal, Reason: ReasonFileIOFailed, Metadata: map[string]string{"filepath": path},
			Message: fmt.Sprintf("%s: streamed write failed (exit %d): %s", path, code, strings.TrimSpace(stderr.String()))}
	}
	return nil
}

func (s *Sandbox) streamRead(ctx context.Context, path string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	code, err := s.Exec(ctx, []string{"/bin/sh", "-c", readScript, "sh", path}, ExecOptions{Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return nil, err
	}
	meta := map[string]string{"filepath": path}
	switch code {
	case 0:
		return stdout.Bytes(), nil
	case exitNotFound:
		return nil, &Error{Code: connect.CodeNotFound, Reason: ReasonFileNotFound, Metadata: meta, Message: path + ": no such file"}
	case exitIsDirectory:
		return nil, &Error{Code: connect.CodeFailedPrecondition, Reason: ReasonFileIsDirectory, Metadata: meta, Message: path + ": is a directory"}
	}
	return nil, &Error{Code: connect.CodeInternal, Reason: ReasonFileIOFailed, Metadata: meta,
		Message: fmt.Sprintf("%s: streamed read failed (exit %d): %s", path, code, strings.TrimSpace(stderr.String()))}
}
