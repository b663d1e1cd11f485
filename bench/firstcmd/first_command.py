"""Sequential time to first command through the official client (cwsandbox).

Expects CWSANDBOX_BASE_URL and CWSANDBOX_API_KEY. Usage: first_command.py N IMAGE. For each
of N runs (after one warm-up): Sandbox.run → exec(["true"]).result() returns, timed; the
sandbox is then stopped (not timed). Prints one line `ms <milliseconds>` per run."""
import sys
import time

from cwsandbox import Sandbox

N = int(sys.argv[1])
IMAGE = sys.argv[2]


def once():
    t0 = time.perf_counter()
    sb = Sandbox.run(container_image=IMAGE)
    try:
        res = sb.exec(["true"]).result(timeout=60)
        took = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"exec: exit code {res.returncode}")
        return took
    finally:
        sb.stop().result(timeout=60)


once()  # warm-up: channel, image cache
for _ in range(N):
    print(f"ms {once() * 1e3:.3f}", flush=True)
