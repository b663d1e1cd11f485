//go:build linux

package edge

import (
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

// TestDialMark: the edge's connections to sandbox ports carry Config.DialMark (the
// local network's guard lets only those into the bridge); none without one.
func TestDialMark(t *testing.T) {
	testenv.RequireRoot(t, "SO_MARK needs CAP_NET_ADMIN")
	for _, mark := range []uint32{0, 0x5bd00000} {
		te := startEdge(t, func(c *Config) { c.DialMark = mark })
		url := te.httpRoute(t, sbxA, 8080, AuthOpen, 0, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
		res, err := te.client("http/1.1").Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(body) != "ok" {
			t.Fatalf("body %q", body)
		}
		// The fast path's connection, idle in the pool after the request: it goes back
		// there just after the response reached the client, so wait for it a little.
		r, _ := te.rm.Lookup(sbxA, 8080)
		var bc *backendConn
		for deadline := time.Now().Add(5 * time.Second); bc == nil && time.Now().Before(deadline); {
			if bc = te.backends.get(r.Backend); bc == nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if bc == nil {
			t.Fatal("no backend connection in the pool")
		}
		raw, err := bc.Conn.(interface {
			SyscallConn() (syscall.RawConn, error)
		}).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		_ = raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
		_ = bc.Close()
		if gerr != nil || uint32(got) != mark {
			t.Errorf("backend connection SO_MARK %#x (%v), want %#x", uint32(got), gerr, mark)
		}
	}
}
