//go:build linux

package sockmark

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

// TestControl: a dialed socket carries exactly the mark asked for (above 1<<31 too);
// mark 0 sets nothing.
func TestControl(t *testing.T) {
	testenv.RequireRoot(t, "SO_MARK needs CAP_NET_ADMIN")
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// 0xfffe0001, not 0xfffffffe: a host running kube-proxy (the test cluster, up beside
	// other tests) drops every packet whose mark has bit 0x8000 (KUBE-MARK-DROP).
	for _, mark := range []uint32{0, 1, 0x5bd00000, 0xfffe0001} {
		d := net.Dialer{Control: Control(mark)}
		if mark == 0 && d.Control != nil {
			t.Errorf("mark 0: a Control")
		}
		c, err := d.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatalf("mark %#x: %v", mark, err)
		}
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		_ = raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
		c.Close()
		if gerr != nil || uint32(got) != mark {
			t.Errorf("SO_MARK = %#x (%v), want %#x", uint32(got), gerr, mark)
		}
	}
}
