"""32 MiB file throughput through the official client (cwsandbox).

Expects CWSANDBOX_BASE_URL and CWSANDBOX_API_KEY. Usage: files.py N IMAGE. Creates one
sandbox, warms the channel, then N times: write_file then read_file of 32 MiB at /tmp/big
(unary WriteFile/ReadFile, as the client sends files up to 32 MiB), each timed, the read
checked. Prints `write <MB/s>` and `read <MB/s>` lines."""
import os
import sys
import time

from cwsandbox import Sandbox

N = int(sys.argv[1])
IMAGE = sys.argv[2]
SIZE = 32 << 20

sb = Sandbox.run("sleep", "3600", container_image=IMAGE)
try:
    sb.wait()
    sb.write_file("/tmp/warm", b"x").result(timeout=60)
    sb.read_file("/tmp/warm").result(timeout=60)
    data = os.urandom(SIZE)
    for _ in range(N):
        t0 = time.perf_counter()
        sb.write_file("/tmp/big", data).result(timeout=300)
        print(f"write {SIZE / (time.perf_counter() - t0) / 1e6:.1f}", flush=True)
        t0 = time.perf_counter()
        back = sb.read_file("/tmp/big").result(timeout=300)
        print(f"read {SIZE / (time.perf_counter() - t0) / 1e6:.1f}", flush=True)
        if back != data:
            raise SystemExit("read back differs")
finally:
    sb.stop().result(timeout=60)
