"""Escape attempts from inside a sandbox. Prints one JSON object: attempt -> outcome,
where an outcome starting with "blocked" means the attempt failed, "ALLOWED" that it
worked. Arguments: host-gateway-ip host-ip port neighbour-ip host-pid host-marker-path."""
import ctypes, ctypes.util, errno, json, os, socket, sys, time

gw, host_ip, port, neighbour, host_pid, marker = sys.argv[1:7]
port = int(port)
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
out = {}


def attempt(name, fn):
    try:
        r = fn()
        out[name] = "ALLOWED" + (f": {r}" if r else "")
    except OSError as e:
        why = errno.errorcode.get(e.errno, e.errno) if e.errno is not None else type(e).__name__
        out[name] = f"blocked ({why})"
    except Exception as e:  # noqa: BLE001 - any failure is a block, say which
        out[name] = f"blocked ({type(e).__name__}: {e})"


def connect(ip, p):
    s = socket.create_connection((ip, p), timeout=2)
    s.close()


def syscall_errno(nr, *args):
    r = libc.syscall(nr, *args)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


attempt("reach a host service on the bridge address", lambda: connect(gw, port))
attempt("reach a host service on the host's address", lambda: connect(host_ip, port))
attempt("reach the metadata address 169.254.169.254", lambda: connect("169.254.169.254", 80))
attempt("reach another sandbox", lambda: connect(neighbour, 8080))


def write_proc_sys():
    with open("/proc/sys/kernel/panic", "w") as f:
        f.write("1")


attempt("write /proc/sys", write_proc_sys)
attempt("mount a file system", lambda: (libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0) or (_ for _ in ()).throw(OSError(ctypes.get_errno(), "mount")))
attempt("load a kernel module (finit_module)", lambda: syscall_errno(313, -1, b"", 0))
attempt("see or signal a host process", lambda: os.kill(int(host_pid), 0))


def ptrace_host():
    # PTRACE_ATTACH = 16 on the host test process's PID.
    r = libc.ptrace(16, int(host_pid), None, None)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


attempt("ptrace a host process", ptrace_host)
attempt("read a host file", lambda: open(marker).read())
attempt("set the clock", lambda: time.clock_settime(time.CLOCK_REALTIME, time.time() + 3600))
attempt("open a raw socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close())
attempt("open a packet socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close())
attempt("reboot the machine", lambda: syscall_errno(169, 0xFEE1DEAD, 672274793, 0x4321FEDC, 0))
attempt("create a device node", lambda: os.mknod("/tmp/sda", 0o600 | 0o060000, os.makedev(8, 0)) or open("/tmp/sda", "rb").read(1))
print(json.dumps(out))
