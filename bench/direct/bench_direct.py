"""Direct data plane vs the gateway, measured in one run with the official client.

Expects CWSANDBOX_BASE_URL and CWSANDBOX_API_KEY (scripts/bench-direct.sh sets them). For
each mode: exec round trip of `true` (p50, p99 over N calls after a warm-up) and 32 MiB
written then read back. Prints the figures and the direct/gateway ratios."""
import os
import statistics
import sys
import time

from cwsandbox import Sandbox

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
SIZE = 32 << 20


def measure(mode):
    sb = Sandbox.run("sleep", "3600", container_image="busybox", data_plane_mode=mode)
    try:
        sb.wait()
        for _ in range(3):  # credentials, connections
            sb.exec(["true"]).result(timeout=60)
        lat = []
        for _ in range(N):
            t0 = time.perf_counter()
            sb.exec(["true"]).result(timeout=60)
            lat.append(time.perf_counter() - t0)
        lat.sort()
        data = os.urandom(SIZE)
        t0 = time.perf_counter()
        sb.write_file("/tmp/big", data).result(timeout=300)
        write = SIZE / (time.perf_counter() - t0) / 1e6
        t0 = time.perf_counter()
        back = sb.read_file("/tmp/big").result(timeout=300)
        read = SIZE / (time.perf_counter() - t0) / 1e6
        assert back == data, "read back differs"
        return {"p50": statistics.median(lat) * 1e3, "p99": lat[int(len(lat) * 0.99) - 1] * 1e3, "write": write, "read": read}
    finally:
        sb.stop().result(timeout=60)


results = {}
for mode in ("gateway", "direct", "gateway", "direct"):  # alternate: the machine is noisy
    r = measure(mode)
    prev = results.get(mode)
    results[mode] = r if prev is None else {k: statistics.median([prev[k], r[k]]) for k in r}
g, d = results["gateway"], results["direct"]
print(f"exec round trip p50   gateway {g['p50']:7.2f} ms   direct {d['p50']:7.2f} ms   direct is {g['p50'] / d['p50']:.2f}x faster")
print(f"exec round trip p99   gateway {g['p99']:7.2f} ms   direct {d['p99']:7.2f} ms")
print(f"32 MiB write          gateway {g['write']:7.1f} MB/s direct {d['write']:7.1f} MB/s ratio {d['write'] / g['write']:.2f}")
print(f"32 MiB read           gateway {g['read']:7.1f} MB/s direct {d['read']:7.1f} MB/s ratio {d['read'] / g['read']:.2f}")
