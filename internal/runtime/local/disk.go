package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/failpoint"
)

// Disk limits. A sandbox with a disk limit keeps its writable layer (the overlay's upper
// and work dirs) on a filesystem of its own of that size: a sparse file in its dir
// (disk.img) formatted ext4, without a journal or reserved blocks, loop-mounted at
// <dir>/disk. A disk filler gets ENOSPC at the limit and the host's disk holds at most
// the limit's worth of its data; the file goes with the sandbox's dir. The loop device
// is attached with autoclear, so unmounting the filesystem (Destroy) detaches it.
//
// The same applies to gVisor: runsc keeps the root filesystem's writes in a file in the
// overlay's upper dir (see gvisor.go), so they land on the limited filesystem too.
//
// No journal: the filesystem is scratch space whose sandbox does not outlive a host
// crash in a useful state anyway, and a journal would cost 64 MiB of real disk per
// sandbox (mkfs zeroes it) and a slower create. No resize inode either (nothing grows
// these filesystems): an empty 10 GiB image then holds ~230 KiB of metadata, not 4 MiB.

const (
	dirDisk       = "disk"
	fileDiskImage = "disk.img"
	// minDiskBytes is the smallest disk limit: ext4 needs a few MiB of its own.
	minDiskBytes = 16 << 20
)

// setupDisk makes dir's size-limited filesystem and mounts it at dir/disk; it returns
// the upper and work dirs made on it.
func (t *diskTemplates) setupDisk(dir string, size int64) (upper, work string, err error) {
	if size < minDiskBytes {
		return "", "", fmt.Errorf("disk limit %d bytes is below the minimum of %d", size, minDiskBytes)
	}
	mnt := filepath.Join(dir, dirDisk)
	if err := t.mountNewFS(filepath.Join(dir, fileDiskImage), mnt, size); err != nil {
		return "", "", err
	}
	upper, work = filepath.Join(mnt, dirUpper), filepath.Join(mnt, dirWork)
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", "", err
		}
	}
	return upper, work, nil
}

// mountNewFS makes img, an empty ext4 of size bytes (a sparse copy of the size's
// template), and mounts it on mnt (made if missing).
func (t *diskTemplates) mountNewFS(img, mnt string, size int64) error {
	tmpl, err := t.get(size)
	if err != nil {
		return err
	}
	if err := copySparse(tmpl, img, size); err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return mountLoop(img, mnt)
}

// diskTemplates keeps one freshly formatted, never mounted image per size in dir, made on
// first use: copying its few hundred KiB of metadata costs well under 1 ms where running
// mkfs.ext4 from the runner costs ~11 ms. (Every copy shares the template's filesystem UUID, which
// nothing here relies on.)
type diskTemplates struct {
	dir string

	mu   sync.Mutex
	made map[int64]string
}

func (t *diskTemplates) get(size int64) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.made[size]; ok {
		return p, nil
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return "", err
	}
	// The format version in the name: a template made with other mkfs options by an
	// earlier version is not reused.
	p := filepath.Join(t.dir, strconv.FormatInt(size, 10)+"-"+diskFormat+".img")
	// A template only ever appears complete (made aside, then renamed), so one left by an
	// earlier run can be used as is.
	if _, err := os.Stat(p); err != nil {
		tmp := p + ".tmp"
		_ = os.Remove(tmp)
		if err := mkfs(tmp, size); err != nil {
			return "", err
		}
		if err := os.Rename(tmp, p); err != nil {
			return "", err
		}
	}
	if t.made == nil {
		t.made = map[int64]string{}
	}
	t.made[size] = p
	return p, nil
}

// diskFormat names mkfs's options below; change it with them.
const diskFormat = "ext4-nojournal-noresize"

// mkfs makes img, a sparse file of size bytes, an ext4 without journal or reserved blocks.
func mkfs(img string, size int64) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "^has_journal,^resize_inode", "-m", "0",
		"-E", "nodiscard,lazy_itable_init=1", img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copySparse copies src's data extents into dst, a new file of size bytes: the holes
// stay holes.
func copySparse(src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(size); err != nil {
		return err
	}
	for pos := int64(0); pos < size; {
		start, err := unix.Seek(int(in.Fd()), pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data after pos
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", src, err)
		}
		end, err := unix.Seek(int(in.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", src, err)
		}
		for off := start; off < end; {
			roff, woff := off, off
			n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(end-off), 0)
			if err != nil {
				return fmt.Errorf("copy %s: %w", src, err)
			}
			if n == 0 {
				return fmt.Errorf("copy %s: short copy at %d", src, off)
			}
			off += int64(n)
		}
		pos = end
	}
	return out.Close()
}

// mountLoop attaches img to a free loop device (autoclear) and mounts its ext4 on mnt.
func mountLoop(img, mnt string) error {
	// noinit_itable: no background thread zeroing the inode tables, which would write
	// them out in full (160 MiB for 10 GiB) to every image.
	return mountLoopFS(img, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable")
}

// mountLoopFS attaches img to a free loop device (autoclear) and mounts its filesystem
// of type fstype on mnt.
func mountLoopFS(img, mnt, fstype string, flags uintptr, data string) error {
	return mountLoopFSWith(img, mnt, fstype, flags, data, false)
}

// mountLoopFSWith is mountLoopFS; direct asks the loop device for direct I/O on img: no second copy of the data in the host's page cache, and a sync of the
// filesystem is one flush of img, not a write-back of its cached pages first. The kernel
// falls back to buffered I/O where img's filesystem cannot do direct I/O.
func mountLoopFSWith(img, mnt, fstype string, flags uintptr, data string, direct bool) error {
	file, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer file.Close()
	dev, lf, err := attachLoop(file, img, direct)
	if err != nil {
		return err
	}
	failpoint.Hit("local.disk.attached")
	err = unix.Mount(dev, mnt, fstype, flags, data)
	if err != nil {
		// Nothing holds the device then: detach it ourselves.
		_ = unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_CLR_FD, 0)
	}
	// The mount holds the device; with autoclear it detaches at the last unmount.
	lf.Close()
	if err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", dev, img, mnt, err)
	}
	return nil
}

// loopMu serializes this process's loop attaches: LOOP_CTL_GET_FREE gives every caller
// the same lowest free device, so concurrent attaches (a burst of creates) would all but
// one lose each round to EBUSY.
var loopMu sync.Mutex

// maxLoopAttempts bounds the retries when another process takes the free device
// between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
const maxLoopAttempts = 50

// attachLoop attaches file (the image img) to a free loop device with autoclear and
// returns the device's path and an open file of it (the caller closes it).
func attachLoop(file *os.File, img string, direct bool) (string, *os.File, error) {
	loopMu.Lock()
	defer loopMu.Unlock()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	for attempt := 1; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := openLoopDevice(dev, n)
		if err != nil {
			return "", nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(file.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if direct {
			cfg.Info.Flags |= unix.LO_FLAGS_DIRECT_IO
		}
		copy(cfg.Info.File_name[:], img)
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if err == nil {
			return dev, lf, nil
		}
		lf.Close()
		if !errors.Is(err, unix.EBUSY) || attempt == maxLoopAttempts {
			return "", nil, fmt.Errorf("attach %s to %s (attempt %d): %w", img, dev, attempt, err)
		}
		// Another process (losetup, another runner) took it: let it finish.
		time.Sleep(time.Duration(attempt) * 100 * time.Microsecond)
	}
}

// openLoopDevice opens /dev/loopN, making the node when /dev is not a devtmpfs.
func openLoopDevice(dev string, n int) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("make %s: %w", dev, err)
		}
		f, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	return f, nil
}
