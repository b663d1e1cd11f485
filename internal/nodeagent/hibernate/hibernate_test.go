package hibernate

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

func TestValidIDs(t *testing.T) {
	for _, id := range []string{"cp-1", "a", "0", "r1-" + strings.Repeat("a", 60)} {
		if err := ValidCheckpointID(id); err != nil {
			t.Errorf("checkpoint id %q: %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "../cp-1", "cp-1/..", "/etc", "CP", "-cp", "cp_1", "cp.1", "cp 1", "a/b", strings.Repeat("a", 64), "cp-1\n"} {
		if err := ValidCheckpointID(id); !errors.Is(err, ErrInvalid) {
			t.Errorf("checkpoint id %q accepted (%v)", id, err)
		}
	}
	for _, id := range []string{strings.Repeat("0f", 32), "abc", "a.b_c-d"} {
		if err := ValidContainerID(id); err != nil {
			t.Errorf("container id %q: %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "../x", "a/b", "-a", "a-", "a..b", strings.Repeat("a", 77), "a\x00"} {
		if err := ValidContainerID(id); !errors.Is(err, ErrInvalid) {
			t.Errorf("container id %q accepted (%v)", id, err)
		}
	}
}

func TestSocketPath(t *testing.T) {
	sb := strings.Repeat("ab", 32)
	p, err := SocketPath("/run/containerd/runsc", sb)
	if err != nil || p != "/run/containerd/runsc/"+sb+"_sandbox.sock" {
		t.Fatalf("%q %v", p, err)
	}
	// A root that leaves no room for a 64-digit ID in a unix socket path (the shim could
	// not listen there either).
	if p, err := SocketPath("/var/lib/sandboxd-k8s/run/runsc", sb); !errors.Is(err, ErrInvalid) {
		t.Errorf("over-long socket path %q accepted", p)
	}
	for _, c := range [][2]string{{"run/runsc", sb}, {"/run/../etc", sb}, {"/run/runsc/", sb}, {"/run/runsc", "../" + sb}, {"/run/runsc", "x/y"}} {
		if p, err := SocketPath(c[0], c[1]); !errors.Is(err, ErrInvalid) {
			t.Errorf("SocketPath(%q, %q) = %q, %v", c[0], c[1], p, err)
		}
	}
}

// TestImageDir: the image directory resolves as the shim patch resolves it for a restore,
// with its checks (scripts/runsc-shim/zz_sandboxd_restore.go.in).
func TestImageDir(t *testing.T) {
	tmp := t.TempDir()
	root := filepath.Join(tmp, "cps")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		// A directory of another user than root is refused: all this test can check.
		if _, err := CreateImageDir(root, "cp-1"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("non-root root dir accepted: %v", err)
		}
		t.Skip("the rest needs root: the directories must be root-owned")
	}
	dir, err := CreateImageDir(root, "cp-1")
	if err != nil || dir != filepath.Join(root, "cp-1") {
		t.Fatalf("CreateImageDir: %q %v", dir, err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("image dir mode: %v %v", fi, err)
	}
	if _, err := CreateImageDir(root, "cp-1"); !errors.Is(err, os.ErrExist) {
		t.Fatalf("existing image dir reused: %v", err)
	}
	// An image directory without its marker (a failed checkpoint's) is not one.
	if got, err := ImageDir(root, "cp-1"); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("ImageDir without the marker: %q %v", got, err)
	}
	if err := MarkComplete(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, CompleteMarker)); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("marker: %v %v", fi, err)
	}
	if err := MarkComplete(dir); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second MarkComplete: %v", err)
	}
	if got, err := ImageDir(root, "cp-1"); err != nil || got != dir {
		t.Fatalf("ImageDir: %q %v", got, err)
	}
	// A marker that is a symlink or writable by others is refused.
	for name, mk := range map[string]func(string) error{
		"marklink": func(d string) error {
			return os.Symlink(filepath.Join(dir, CompleteMarker), filepath.Join(d, CompleteMarker))
		},
		"markwide": func(d string) error {
			if err := os.WriteFile(filepath.Join(d, CompleteMarker), nil, 0o600); err != nil {
				return err
			}
			return os.Chmod(filepath.Join(d, CompleteMarker), 0o666)
		},
	} {
		d, err := CreateImageDir(root, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := mk(d); err != nil {
			t.Fatal(err)
		}
		if got, err := ImageDir(root, name); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %q %v", name, got, err)
		}
	}
	// A parent of the root writable by others is refused unless sticky.
	if err := os.Chmod(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	if got, err := ImageDir(root, "cp-1"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "parent") {
		t.Errorf("world-writable parent: %q %v", got, err)
	}
	if _, err := CreateImageDir(root, "cp-3"); !errors.Is(err, ErrInvalid) {
		t.Errorf("CreateImageDir under a world-writable parent: %v", err)
	}
	if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if got, err := ImageDir(root, "cp-1"); err != nil {
		t.Errorf("sticky parent: %q %v", got, err)
	}
	if err := os.Chmod(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "wide"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "wide"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "user"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(root, "user"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"link", "wide", "user", "file", "missing", "../cps/cp-1", "."} {
		if got, err := ImageDir(root, id); err == nil {
			t.Errorf("ImageDir(%q) = %q", id, got)
		}
	}
	for _, r := range []string{"cps", root + "/", root + "/../cps"} {
		if got, err := ImageDir(r, "cp-1"); !errors.Is(err, ErrInvalid) {
			t.Errorf("root %q: %q %v", r, got, err)
		}
	}
	// A root writable by others, or reached through a symlink, is refused too.
	if err := os.Symlink(root, filepath.Join(tmp, "rootlink")); err != nil {
		t.Fatal(err)
	}
	if got, err := ImageDir(filepath.Join(tmp, "rootlink"), "cp-1"); err == nil {
		t.Errorf("symlinked root: %q", got)
	}
	if err := os.Chmod(root, 0o777); err != nil {
		t.Fatal(err)
	}
	if got, err := ImageDir(root, "cp-1"); err == nil {
		t.Errorf("world-writable root: %q", got)
	}
	if got, err := CreateImageDir(root, "cp-2"); err == nil {
		t.Errorf("CreateImageDir under a world-writable root: %q", got)
	}
}

// The golden encodings were made with gVisor's generated task_server_go_proto types and
// containerd/ttrpc's Request/Response (proto.Marshal, deterministic) for the same values.
const (
	goldenCheckpoint  = "0a06616263313233120b2f7661722f782f63702d31180120013210666c6174652d626573742d7370656564"
	goldenWait        = "0a066162633132331001"
	goldenRequest     = "0a17677669736f722e7461736b2e5461736b53657276696365120a436865636b706f696e741a2b" + goldenCheckpoint
	goldenRespWait    = "12020807"             // Response{payload: WaitResponse{exit_status: 7}}
	goldenRespErr     = "0a0808021204626f6f6d" // Response{status: {code: 2, message: "boom"}}
	goldenRespVersion = "12080a06762d74657374" // Response{payload: VersionResponse{version: "v-test"}}
)

func TestMarshal(t *testing.T) {
	req := CheckpointRequest{ContainerID: "abc123", ImagePath: "/var/x/cp-1", LeaveRunning: true, Direct: true, Compression: "flate-best-speed"}
	b, err := req.marshal()
	if err != nil || hex.EncodeToString(b) != goldenCheckpoint {
		t.Fatalf("CheckpointRequest: %x %v, want %s", b, err, goldenCheckpoint)
	}
	if w, err := waitRequest("abc123"); err != nil || hex.EncodeToString(w) != goldenWait {
		t.Fatalf("WaitRequest: %x %v, want %s", w, err, goldenWait)
	}
	m, err := marshalRequest(context.Background(), methodCheckpoint, b)
	if err != nil || hex.EncodeToString(m) != goldenRequest {
		t.Fatalf("ttrpc Request: %x %v, want %s", m, err, goldenRequest)
	}
	for _, bad := range []CheckpointRequest{
		{ContainerID: "../x", ImagePath: "/var/x/cp-1"},
		{ContainerID: "abc", ImagePath: "var/x/cp-1"},
		{ContainerID: "abc", ImagePath: "/var/x/../cp-1"},
		{ContainerID: "abc", ImagePath: "/var/x/cp-1", Compression: "zstd --evil"},
	} {
		if _, err := bad.marshal(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	// A deadline travels as timeout_nano (field 4): the shim's call ends with it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, _ = marshalRequest(ctx, methodCheckpoint, b)
	if !strings.HasPrefix(hex.EncodeToString(m), goldenRequest+"20") {
		t.Errorf("request with a deadline: %x", m)
	}
}

// fakeServer answers each ttrpc request on socket with the next of answers (hex of a
// ttrpc Response, or a raw frame to send instead when it starts with "raw:"), after
// checking the request's stream ID and method; it reports what it got on got.
func fakeServer(t *testing.T, answers ...string) (string, <-chan string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "sb_sandbox.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got := make(chan string, len(answers))
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		for _, a := range answers {
			h := make([]byte, headerLen)
			if _, err := io.ReadFull(conn, h); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint32(h[:4]))
			if _, err := io.ReadFull(conn, body); err != nil {
				return
			}
			sid := binary.BigEndian.Uint32(h[4:8])
			method, _ := stringField(body, 2)
			svc, _ := stringField(body, 1)
			got <- svc + "/" + method + " stream " + string(rune('0'+sid)) + " type " + string(rune('0'+h[8]))
			if raw, ok := strings.CutPrefix(a, "raw:"); ok {
				b, _ := hex.DecodeString(raw)
				_, _ = conn.Write(b)
				continue
			}
			b, _ := hex.DecodeString(a)
			_, _ = conn.Write(frame(sid, typeResponse, b))
		}
		// Hold the connection until the client closes it.
		_, _ = io.Copy(io.Discard, conn)
	}()
	return sock, got
}

func TestClient(t *testing.T) {
	sock, got := fakeServer(t, goldenRespVersion, "", goldenRespErr, goldenRespWait)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := c.Version(ctx); err != nil || v != "v-test" {
		t.Fatalf("Version: %q %v", v, err)
	}
	req := CheckpointRequest{ContainerID: "abc123", ImagePath: "/var/x/cp-1"}
	if err := c.Checkpoint(ctx, req); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	var ce *CallError
	if err := c.Checkpoint(ctx, req); !errors.As(err, &ce) || ce.Code != 2 || ce.Message != "boom" || ce.Method != "Checkpoint" {
		t.Fatalf("Checkpoint error: %v", err)
	}
	if st, err := c.WaitCheckpoint(ctx, "abc123"); err != nil || st != 7 {
		t.Fatalf("WaitCheckpoint: %d %v", st, err)
	}
	// Streams 1, 3, 5, 7 (ttrpc's client side), requests, in order.
	for _, want := range []string{"Version stream 1", "Checkpoint stream 3", "Checkpoint stream 5", "Wait stream 7"} {
		if g := <-got; g != "gvisor.task.TaskService/"+want+" type 1" {
			t.Errorf("server got %q, want %q", g, want)
		}
	}
	if _, err := c.WaitCheckpoint(ctx, "../x"); !errors.Is(err, ErrInvalid) {
		t.Errorf("WaitCheckpoint of a bad id: %v", err)
	}
}

// TestClientBadServer: an answer out of step (another stream, an oversized frame) fails
// the call and every later one; a context's deadline ends a call the server never answers.
func TestClientBadServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wrongStream := "raw:" + hex.EncodeToString(frame(9, typeResponse, []byte{}))
	oversized := "raw:" + hex.EncodeToString([]byte{0x7f, 0, 0, 0, 0, 0, 0, 1, typeResponse, 0})
	for name, answer := range map[string]string{"wrong stream": wrongStream, "oversized": oversized} {
		sock, _ := fakeServer(t, answer)
		c, err := Dial(ctx, sock)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Version(ctx); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if _, err := c.Version(ctx); err == nil || !strings.Contains(err.Error(), "unusable") {
			t.Errorf("%s: the next call: %v", name, err)
		}
		c.Close()
	}
	sock, _ := fakeServer(t) // reads nothing, answers nothing
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	start := time.Now()
	if _, err := c.Version(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("unanswered call: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("unanswered call took %s", d)
	}
}

// TestShimPatternsAgree: the shim patch's checkpoint ID pattern and marker name are this
// package's (they are two copies: the patch builds inside gVisor's module).
func TestShimPatternsAgree(t *testing.T) {
	b, err := os.ReadFile("../../../scripts/runsc-shim/zz_sandboxd_restore.go.in")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	m := regexp.MustCompile("sandboxdCheckpointID = regexp.MustCompile\\(`([^`]*)`\\)").FindStringSubmatch(src)
	if m == nil || m[1] != checkpointID.String() {
		t.Errorf("shim's checkpoint ID pattern %q, hibernate's %q", m, checkpointID.String())
	}
	if !strings.Contains(src, `sandboxdCompleteMarker = "`+CompleteMarker+`"`) {
		t.Errorf("the shim's marker is not %q", CompleteMarker)
	}
	if !strings.Contains(src, `sandboxdRestoreAnnotation = "`+RestoreAnnotation+`"`) {
		t.Errorf("the shim's annotation is not %q", RestoreAnnotation)
	}
}

// TestClientContext: a context done before a call leaves the connection usable; an error
// reply near ttrpc's 4 MiB cap is read, its message clipped.
func TestClientContext(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	st := protowire.AppendString(protowire.AppendTag(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 2), 2, protowire.BytesType), long)
	resp := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), st)
	sock, _ := fakeServer(t, goldenRespVersion, hex.EncodeToString(resp))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done, dcancel := context.WithCancel(ctx)
	dcancel()
	if _, err := c.Version(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	if v, err := c.Version(ctx); err != nil || v != "v-test" {
		t.Fatalf("call after a cancelled one: %q %v", v, err)
	}
	var ce *CallError
	if err := c.Checkpoint(ctx, CheckpointRequest{ContainerID: "abc", ImagePath: "/x"}); !errors.As(err, &ce) || ce.Code != 2 || len(ce.Message) > maxErrorMessage+len("…") {
		t.Fatalf("1 MiB error reply: %v", err)
	}
}

func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{goldenRespWait, goldenRespErr, goldenRespVersion, "", "0a", "12ff", "0aff0101"} {
		b, _ := hex.DecodeString(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseResponse("Version", b)
		var ce *CallError
		if errors.As(err, &ce) && len(ce.Message) > maxErrorMessage+len("…") {
			t.Fatalf("message of %d bytes", len(ce.Message))
		}
		if err == nil {
			if v, err := stringField(p, 1); err == nil && len(v) > maxErrorMessage+len("…") {
				t.Fatalf("string of %d bytes", len(v))
			}
			_, _ = varintField(p, 1)
		}
		_, _ = stringField(b, 1)
		_, _ = varintField(b, 2)
	})
}
