"""Escape attempts from inside a sandbox. Prints one JSON object: attempt -> outcome,
where an outcome starting with "blocked" means the attempt failed, "ALLOWED" that it
worked; "control: …" entries must be ALLOWED (they show the network works at all).
Arguments: host-gateway-ip host-ip port neighbour-ip host-pid host-marker-path
granted-name other-name other-ip outside-dns-ip: the sandbox may reach granted-name over
HTTPS (an egress dns_name rule) and nothing else of the "internet" the other three are in."""
import ctypes, ctypes.util, errno, json, os, socket, ssl, struct, sys, time

gw, host_ip, port, neighbour, host_pid, marker = sys.argv[1:7]
granted, other, other_ip, outside_dns = sys.argv[7:11]
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


def tls(name, ip=None, sni=True):
    s = socket.create_connection((ip or socket.gethostbyname(name), 443), timeout=4)
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.wrap_socket(s, server_hostname=name if sni else None).close()


def dns_query(server, name):
    q = struct.pack(">HHHHHH", 0x5bd, 0x100, 1, 0, 0, 0) + b"".join(
        bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(q, (server, 53))
    s.recvfrom(512)


attempt("control: HTTPS to the granted name", lambda: tls(granted))
attempt("control: the platform DNS resolves an ungranted name", lambda: socket.gethostbyname(other) and None)
attempt("egress: HTTPS to a name outside the grants", lambda: tls(other))
attempt("egress: TLS to an address outside the grants, no SNI", lambda: tls(other, ip=other_ip, sni=False))
attempt("egress: plain TCP to an address outside the grants", lambda: connect(other_ip, 80))
attempt("egress: DNS straight to an outside resolver", lambda: dns_query(outside_dns, granted))


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
