package local

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

// TestWriteNetSysctl: the sysctl is set in the calling thread's network namespace (not
// the host's). (It looks the file up in a procfs mounted for the write and attached
// nowhere: see writeNetSysctl.)
func TestWriteNetSysctl(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, procfs mounts")
	const key, path = "net.ipv4.ping_group_range", "/proc/sys/net/ipv4/ping_group_range"
	host, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		got string
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		if err := writeNetSysctl(key, "0 4242"); err != nil {
			done <- result{err: err}
			return
		}
		b, err := os.ReadFile(path)
		done <- result{string(b), err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := strings.Join(strings.Fields(r.got), " "); got != "0 4242" {
		t.Errorf("in the namespace: %q, want 0 4242", r.got)
	}
	if after, _ := os.ReadFile(path); string(after) != string(host) {
		t.Errorf("the host's value changed: %q → %q", host, after)
	}
}
