"""Helpers for a ``sandboxd dev`` of one's own, shared by the conformance suite (conftest.py,
the tests) and the SDK benchmark (bench/sdk/run.py): a free port, stopping the server,
removing what it leaves behind, its log's tail, and the client's API-key auth."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

LOG_TAIL_LINES = 200
STOP_TIMEOUT = 20.0


def tail(path: pathlib.Path | None, offset: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    if path is None or not path.exists():
        return "(no server log)"
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    text = data.decode("utf-8", errors="replace").splitlines()
    cut = len(text) - lines
    head = [f"... ({cut} earlier lines in {path})"] if cut > 0 else []
    return "\n".join(head + text[-lines:]) or "(empty)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mounts_under(path: pathlib.Path) -> list[str]:
    prefix = str(path.resolve())
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4]
                if mp == prefix or mp.startswith(prefix + "/"):
                    out.append(mp)
    except OSError:
        pass
    return out


def remove_data_dir(data_dir: pathlib.Path) -> None:
    """Remove our temp data dir once the server has stopped.

    A stopped sandboxd leaves network/mntns mounted (the mount namespace holding its sandboxes'
    network namespaces, kept across restarts) and may leave empty mount points; those are
    unmounted. Anything else still mounted (a sandbox's rootfs) means something is still
    running: then the directory is left alone and reported.
    """
    mounts = mounts_under(data_dir)
    holder = str(data_dir / "network" / "mntns")
    busy = [m for m in mounts if m != holder and not (os.path.isdir(m) and not os.listdir(m))]
    if busy:
        print(f"\nleaving {data_dir}: still has mounts {busy[:5]}")
        return
    for m in sorted(mounts, key=len, reverse=True):
        res = subprocess.run(["umount", m], capture_output=True, text=True)
        if res.returncode != 0:
            print(f"\nleaving {data_dir}: umount {m}: {res.stderr.strip()}")
            return
    shutil.rmtree(data_dir, ignore_errors=True)


def remove_network(bridge: str, cgroup_parent: str) -> None:
    """Remove the server's own bridge, nftables table and (empty) cgroup parent once it has
    stopped: it leaves them for a next start, which there is not."""
    subprocess.run(["nft", "delete", "table", "inet", f"sandboxd_{bridge}"], capture_output=True)
    # The bridge's anti-spoofing table (internal/runtime/local/network/antispoof.go).
    subprocess.run(["nft", "delete", "table", "bridge", f"sandboxd_{bridge}"], capture_output=True)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    for d in cgroup_dirs(cgroup_parent):
        try:
            d.rmdir()  # fails, rightly, if a sandbox's cgroup is still inside
        except OSError:
            pass


def cgroup_dirs(cgroup_parent: str) -> list[pathlib.Path]:
    """The directories of a cgroup parent in every hierarchy (cgroup_hierarchies)."""
    return [d for d in (h / cgroup_parent for h in cgroup_hierarchies()) if d.is_dir()]


def cgroup_hierarchies() -> list[pathlib.Path]:
    """The roots of the cgroup hierarchies: a pure cgroup v2 host's /sys/fs/cgroup (it has
    cgroup.controllers), or a v1 (hybrid) host's cgroup mounts right below it. Never a
    cgroup below a root: on a pure v2 host /sys/fs/cgroup/*/ are cgroups (a runner's
    /sys/fs/cgroup/sandboxd holds sandboxes whose IDs a tenant chooses)."""
    root = pathlib.Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    out: list[pathlib.Path] = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[2] in ("cgroup", "cgroup2"):
                    mp = pathlib.Path(fields[1])
                    if mp.parent == root and mp not in out:
                        out.append(mp)
    except OSError:
        pass
    return out


def remove_cgroups(cgroup_parent: str, timeout: float = 10.0) -> list[str]:
    """Kill the processes left in a cgroup parent's cgroups (a sandbox's agent) and remove
    the cgroups, deepest first; return what was there ("cgroup REL holding pids ...")."""
    found: list[str] = []
    dirs: list[pathlib.Path] = []
    for top in cgroup_dirs(cgroup_parent):
        for d, _, _ in os.walk(top):
            d = pathlib.Path(d)
            dirs.append(d)
            try:
                pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pids = []
            rel = d.relative_to(top.parent)
            found.append(f"cgroup {rel} ({top.parent.name})" + (f" holding pids {pids}" if pids else ""))
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    deadline = time.monotonic() + timeout
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)  # the killed processes are going
    return found


def stop(proc: subprocess.Popen) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return None


def auth(key: str):
    from cwsandbox import AuthHeaders

    return AuthHeaders(headers={"Authorization": f"Bearer {key}"}, strategy="api_key")
