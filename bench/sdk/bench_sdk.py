"""API call -> first command through the official client (cwsandbox), in the manner of
ComputeSDK's benchmark: sequential, staggered and burst runs.

Expects CWSANDBOX_BASE_URL and CWSANDBOX_API_KEY. Usage:
    bench_sdk.py IMAGE sequential N
    bench_sdk.py IMAGE staggered N INTERVAL_MS
    bench_sdk.py IMAGE burst N
One run is Sandbox.run(container_image=IMAGE) then exec(["true"]).result(), timed from
the call; its sandbox is stopped afterwards (not timed). A run that raises or whose
command does not exit 0 is a failure. Prints one line per run (`ok <ms>` or
`fail <error>`) and then `wall <ms>`; scripts/bench-sdk.sh summarises them.
"""
import sys
import threading
import time

from cwsandbox import Sandbox

IMAGE, MODE, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
INTERVAL = float(sys.argv[4]) / 1e3 if MODE == "staggered" else 0.0

lock = threading.Lock()
made = []


def once(out):
    t0 = time.perf_counter()
    try:
        sb = Sandbox.run(container_image=IMAGE)
        with lock:
            made.append(sb)
        res = sb.exec(["true"]).result(timeout=120)
        took = time.perf_counter() - t0
        if res.returncode != 0:
            raise RuntimeError(f"exit code {res.returncode}")
        out.append(f"ok {took * 1e3:.3f}")
    except Exception as e:  # noqa: BLE001 - every failure is counted, none stops the run
        out.append("fail " + " ".join(f"{type(e).__name__}: {e}".split())[:200])


def stop_all():
    for sb in made:
        try:
            sb.stop().result(timeout=120)
        except Exception:  # noqa: BLE001
            pass
    made.clear()


# Warm-up: the channel and the image cache.
warm = []
once(warm)
stop_all()
if not warm[0].startswith("ok"):
    raise SystemExit("warm-up failed: " + warm[0])

lines = []
t0 = time.perf_counter()
if MODE == "sequential":
    for _ in range(N):
        once(lines)
        stop_all()
else:
    threads = []
    for i in range(N):
        th = threading.Thread(target=once, args=(lines,))
        th.start()
        threads.append(th)
        if INTERVAL:
            time.sleep(INTERVAL)
    for th in threads:
        th.join()
wall = time.perf_counter() - t0
stop_all()
for line in lines:
    print(line)
print(f"wall {wall * 1e3:.3f}", flush=True)
