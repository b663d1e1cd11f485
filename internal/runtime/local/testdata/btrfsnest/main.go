// Command btrfsnest tries, from inside a sandbox, to make btrfs subvolumes and
// snapshots in a directory (a volume): btrfsnest DIR. It prints one line per attempt,
// "<what>: ok" or "<what>: <errno>".
package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

type volArgs struct {
	Fd   int64
	Name [4088]byte
}

type volArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64
	Name    [4040]byte
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

func main() {
	dir, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fd := int(dir.Fd())
	report := func(what string, err error) {
		if err != nil {
			fmt.Printf("%s: %v\n", what, err)
		} else {
			fmt.Printf("%s: ok\n", what)
		}
	}
	var a volArgs
	copy(a.Name[:], "sub1")
	report("SUBVOL_CREATE", ioctl(fd, 0x5000940e, unsafe.Pointer(&a)))
	var b volArgsV2
	copy(b.Name[:], "sub2")
	report("SUBVOL_CREATE_V2", ioctl(fd, 0x50009418, unsafe.Pointer(&b)))
	c := volArgs{Fd: int64(fd)}
	copy(c.Name[:], "snap1")
	report("SNAP_CREATE", ioctl(fd, 0x50009401, unsafe.Pointer(&c)))
	var e volArgs
	copy(e.Name[:], "sub3")
	// The kernel reads the request as an unsigned int: bits above 32 must not get a
	// refused request past a filter.
	report("SUBVOL_CREATE|1<<32", ioctl(fd, 0x5000940e|1<<32, unsafe.Pointer(&e)))
	d := volArgsV2{Fd: int64(fd)}
	copy(d.Name[:], "snap2")
	report("SNAP_CREATE_V2", ioctl(fd, 0x50009417, unsafe.Pointer(&d)))
}
