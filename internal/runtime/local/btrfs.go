package local

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The few btrfs ioctls the volume pool uses (include/uapi/linux/btrfs.h), defined here:
// golang.org/x/sys/unix has none of them.

const (
	btrfsIocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocSnapCreateV2 = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	btrfsIocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	btrfsSubvolRdonly     = 1 << 1
	btrfsQuotaCtlEnable   = 1
	btrfsQgroupLimitRfer  = 1 << 0
	btrfsFirstFreeObjecID = 256 // the inode number of every subvolume's root
)

// struct btrfs_ioctl_vol_args
type btrfsVolArgs struct {
	Fd   int64
	Name [4088]byte
}

// struct btrfs_ioctl_vol_args_v2
type btrfsVolArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64
	Name    [4040]byte
}

// struct btrfs_ioctl_qgroup_limit_args
type btrfsQgroupLimitArgs struct {
	Qgroupid uint64
	Flags    uint64
	MaxRfer  uint64
	MaxExcl  uint64
	RsvRfer  uint64
	RsvExcl  uint64
}

// struct btrfs_ioctl_quota_ctl_args
type btrfsQuotaCtlArgs struct {
	Cmd    uint64
	Status uint64
}

func init() {
	// The ioctl numbers above encode these sizes.
	if unsafe.Sizeof(btrfsVolArgs{}) != 4096 || unsafe.Sizeof(btrfsVolArgsV2{}) != 4096 ||
		unsafe.Sizeof(btrfsQgroupLimitArgs{}) != 48 || unsafe.Sizeof(btrfsQuotaCtlArgs{}) != 16 {
		panic("btrfs ioctl structs have the wrong size")
	}
}

func btrfsIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

func setName(dst []byte, name string) error {
	if name == "" || len(name) >= len(dst) || name == "." || name == ".." {
		return fmt.Errorf("bad subvolume name %q", name)
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return fmt.Errorf("bad subvolume name %q", name)
		}
	}
	copy(dst, name)
	return nil
}

// subvolCreate makes the subvolume name in the directory parent.
func subvolCreate(parent *os.File, name string) error {
	var a btrfsVolArgs
	if err := setName(a.Name[:], name); err != nil {
		return err
	}
	if err := btrfsIoctl(int(parent.Fd()), btrfsIocSubvolCreate, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("create subvolume %s: %w", name, err)
	}
	return nil
}

// subvolSnapshot makes name in the directory parent a snapshot of the subvolume src
// (read-only with readOnly).
func subvolSnapshot(src, parent *os.File, name string, readOnly bool) error {
	a := btrfsVolArgsV2{Fd: int64(src.Fd())}
	if readOnly {
		a.Flags = btrfsSubvolRdonly
	}
	if err := setName(a.Name[:], name); err != nil {
		return err
	}
	if err := btrfsIoctl(int(parent.Fd()), btrfsIocSnapCreateV2, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("snapshot subvolume into %s: %w", name, err)
	}
	return nil
}

// subvolDestroy deletes the subvolume name in the directory parent, content and all.
// Subvolumes nested in it (a sandbox may make some in its volume) are deleted first.
func subvolDestroy(parent *os.File, name string) error {
	var a btrfsVolArgs
	if err := setName(a.Name[:], name); err != nil {
		return err
	}
	err := btrfsIoctl(int(parent.Fd()), btrfsIocSnapDestroy, unsafe.Pointer(&a))
	if errors.Is(err, unix.ENOTEMPTY) {
		if nerr := destroyNested(parent, name, 0); nerr != nil {
			return fmt.Errorf("delete subvolume %s: %w", name, nerr)
		}
		err = btrfsIoctl(int(parent.Fd()), btrfsIocSnapDestroy, unsafe.Pointer(&a))
	}
	if err != nil {
		return fmt.Errorf("delete subvolume %s: %w", name, err)
	}
	return nil
}

// destroyNested deletes the subvolumes below parent/name (walking by descriptor, never
// following a symlink).
func destroyNested(parent *os.File, name string, depth int) error {
	if depth > 64 {
		return errors.New("nested too deep")
	}
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	dir := os.NewFile(uintptr(fd), name)
	defer dir.Close()
	ents, err := dir.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if st.Ino == btrfsFirstFreeObjecID {
			if err := subvolDestroy(dir, e.Name()); err != nil {
				return err
			}
			continue
		}
		if err := destroyNested(dir, e.Name(), depth+1); err != nil {
			return err
		}
	}
	return nil
}

// qgroupLimit limits the referenced bytes of the subvolume open as dir to limit (0: no
// limit).
func qgroupLimit(dir *os.File, limit int64) error {
	a := btrfsQgroupLimitArgs{Flags: btrfsQgroupLimitRfer, MaxRfer: uint64(limit)}
	if limit <= 0 {
		a.MaxRfer = ^uint64(0) // the kernel's "no limit"
	}
	if err := btrfsIoctl(int(dir.Fd()), btrfsIocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("limit subvolume to %d bytes: %w", limit, err)
	}
	return nil
}

// quotaEnable turns quotas (qgroups) on for the btrfs filesystem of dir.
func quotaEnable(dir *os.File) error {
	a := btrfsQuotaCtlArgs{Cmd: btrfsQuotaCtlEnable}
	if err := btrfsIoctl(int(dir.Fd()), btrfsIocQuotaCtl, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("enable quotas: %w", err)
	}
	return nil
}

// isSubvolume says whether the directory open as dir is a btrfs subvolume's root.
func isSubvolume(dir *os.File) bool {
	var st unix.Stat_t
	var fs unix.Statfs_t
	return unix.Fstat(int(dir.Fd()), &st) == nil && st.Ino == btrfsFirstFreeObjecID &&
		unix.Fstatfs(int(dir.Fd()), &fs) == nil && fs.Type == unix.BTRFS_SUPER_MAGIC
}
