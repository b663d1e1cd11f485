package local

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

// TestWriteNetSysctl: the sysctl is set in the calling thread's network namespace (not
// the host's), through /proc and through a procfs mounted for the write and attached
// nowhere (see writeNetSysctl).
func TestWriteNetSysctl(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, procfs mounts")
	for _, fresh := range []bool{false, true} {
		t.Run(fmt.Sprintf("fresh=%v", fresh), func(t *testing.T) { testWriteNetSysctl(t, fresh) })
	}
}

func testWriteNetSysctl(t *testing.T, fresh bool) {
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
		if err := writeNetSysctl(key, "0 4242", fresh, nil); err != nil {
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

// TestFreshProc: a procfs of its own can be had here (the fast path of writeNetSysctl,
// not its silent fallback to /proc), and it is another superblock than /proc's (kernel
// ≥ 5.8; before, every procfs of a pid namespace shared one, and so its dentries).
func TestFreshProc(t *testing.T) {
	testenv.RequireRoot(t, "procfs mounts")
	mnt, err := freshProc()
	if err != nil {
		t.Fatalf("freshProc: %v (net sysctls would go through /proc)", err)
	}
	defer unix.Close(mnt)
	var fresh, proc unix.Stat_t
	if err := unix.Fstat(mnt, &fresh); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc", &proc); err != nil {
		t.Fatal(err)
	}
	if fresh.Dev == proc.Dev {
		t.Errorf("the fresh procfs has /proc's device %d: one superblock, no gain", proc.Dev)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(mnt, &sfs); err != nil || sfs.Type != unix.PROC_SUPER_MAGIC {
		t.Errorf("not a procfs: type %#x, %v", sfs.Type, err)
	}
}

// TestFreshProcSysctlThreshold: net sysctls go through /proc while the backend runs
// fewer than freshProcAbove sandboxes, through a fresh procfs from there.
func TestFreshProcSysctlThreshold(t *testing.T) {
	b := &Backend{sandboxes: map[string]*sandbox{}}
	for i := range freshProcAbove - 1 {
		b.sandboxes[fmt.Sprint(i)] = nil
	}
	if b.freshProcSysctl() {
		t.Errorf("fresh procfs with %d sandboxes running", len(b.sandboxes))
	}
	b.sandboxes["last"] = nil
	if !b.freshProcSysctl() {
		t.Errorf("/proc with %d sandboxes running", len(b.sandboxes))
	}
}

// BenchmarkNetSysctl: the cost of one net sysctl write through /proc and through a
// fresh procfs, with 0 to 1,000 other network namespaces that each looked up
// /proc/sys/net/ipv4 (as sandboxes do): what freshProcAbove is chosen from. Root.
func BenchmarkNetSysctl(b *testing.B) {
	testenv.RequireRoot(b, "network namespaces, procfs mounts")
	var held []int
	defer func() {
		for _, fd := range held {
			_ = unix.Close(fd)
		}
	}()
	grow := func(n int) {
		for len(held) < n {
			fdc := make(chan int, 1)
			go func() {
				runtime.LockOSThread() // never unlocked: the thread ends in its namespace
				if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
					fdc <- -1
					return
				}
				_, _ = os.ReadFile("/proc/sys/net/ipv4/ping_group_range")
				fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					fd = -1
				}
				fdc <- fd
			}()
			fd := <-fdc
			if fd < 0 {
				b.Fatal("new network namespace failed")
			}
			held = append(held, fd)
		}
	}
	for _, n := range []int{0, 100, 300, 500, 700, 1000} {
		grow(n)
		for _, fresh := range []bool{false, true} {
			b.Run(fmt.Sprintf("ns=%d/fresh=%v", n, fresh), func(b *testing.B) {
				// Each write in a network namespace of its own, new (as at a create):
				// its first lookup there. Only the write is timed.
				var total time.Duration
				for range b.N {
					type result struct {
						d   time.Duration
						err error
					}
					done := make(chan result, 1)
					go func() {
						runtime.LockOSThread() // never unlocked: the thread ends in its namespace
						if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
							done <- result{err: err}
							return
						}
						t0 := time.Now()
						err := writeNetSysctl("net.ipv4.ping_group_range", "0 4242", fresh, nil)
						done <- result{time.Since(t0), err}
					}()
					r := <-done
					if r.err != nil {
						b.Fatal(r.err)
					}
					total += r.d
				}
				b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/write")
			})
		}
	}
}
