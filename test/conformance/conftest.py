"""Fixtures for the conformance suite: a ``sandboxd dev`` started by the suite, API keys, cleanup.

The suite never builds anything. It needs ``bin/sandboxd`` (``make build``; override with
``SANDBOXD_BIN``) with a ``dev`` subcommand and root (containers). Without them the client tests
skip, unless ``SANDBOXD_CONFORMANCE_REQUIRED=1``, which turns the skip into a failure (CI).

Environment:
  SANDBOXD_BIN                    path of the sandboxd binary (default: <repo>/bin/sandboxd)
  SANDBOXD_DATA_DIR               data dir for ``sandboxd dev`` (default: a fresh temp dir)
  SANDBOXD_READY_TIMEOUT          seconds to wait for GET /readyz (default 60)
  SANDBOXD_CONFORMANCE_REQUIRED   1 = a missing binary/root fails instead of skipping
  SANDBOXD_TEST_OCI_RUNTIME       runc (default) or crun: ``sandboxd dev --oci-runtime`` (docs/oci-runtime.md)

The server's stdout/stderr go to a file (its path is printed in the report header). When a test
fails, the part of that log written during the test (at most the last 200 lines) is attached to
the failure report as a section named "sandboxd log".
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

import pytest
from devserver import LOG_TAIL_LINES, STOP_TIMEOUT  # noqa: F401
from devserver import auth as _auth
from devserver import free_port as _free_port
from devserver import remove_data_dir as _remove_data_dir
from devserver import remove_network as _remove_network
from devserver import stop as _stop
from devserver import tail as _tail

REPO = pathlib.Path(__file__).resolve().parents[2]

# Set by the sandboxd fixture; read by the report hook.
_LOG_PATH: pathlib.Path | None = None


def _required() -> bool:
    return os.environ.get("SANDBOXD_CONFORMANCE_REQUIRED", "") not in ("", "0", "false", "no")


def _unavailable(msg: str) -> None:
    """Skip (default) or fail (SANDBOXD_CONFORMANCE_REQUIRED=1) because the server can't run."""
    if _required():
        pytest.fail(f"{msg} (SANDBOXD_CONFORMANCE_REQUIRED is set)", pytrace=False)
    pytest.skip(msg)


@dataclass
class Server:
    binary: pathlib.Path
    data_dir: pathlib.Path
    base_url: str
    admin_key: str
    log_path: pathlib.Path
    proc: subprocess.Popen
    extra_keys: dict[str, str] = field(default_factory=dict)
    data_plane: str = ""  # host:port of the runner's direct data plane
    edge: str = ""  # host:port of the runner's edge (endpoints; trust data_dir/ca.pem)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines=lines)

    def create_api_key(self, org: str, role: str = "user") -> str:
        """``sandboxd apikey create`` for ORG; returns the key printed on stdout."""
        cmd = [str(self.binary), "apikey", "create", "--data-dir", str(self.data_dir), "--org", org, "--role", role]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
        if res.returncode != 0 or not lines:
            pytest.fail(
                f"`{' '.join(cmd)}` failed (exit {res.returncode}):\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}",
                pytrace=False,
            )
        # The key is the last non-empty stdout line; tolerate a "KEY=value" form.
        m = re.fullmatch(r"[A-Z_]+=(\S+)", lines[-1])
        return m.group(1) if m else lines[-1]


def _check_binary() -> pathlib.Path:
    binary = pathlib.Path(os.environ.get("SANDBOXD_BIN") or REPO / "bin" / "sandboxd")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        _unavailable(f"{binary} not found: run `make build` first (or set SANDBOXD_BIN)")
    try:
        res = subprocess.run([str(binary), "dev", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        _unavailable(f"`{binary} dev --help` could not run: {e}")
    out = res.stdout + res.stderr
    if re.search(r"unknown (command|subcommand)", out, re.I):
        _unavailable(f"{binary} has no `dev` subcommand yet: {out.strip().splitlines()[0] if out.strip() else ''}")
    if os.geteuid() != 0:
        _unavailable("sandboxd dev needs root (containers, namespaces, cgroups)")
    return binary


def _read_key(path: pathlib.Path, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        try:
            key = path.read_text().strip()
            if key:
                return key
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    return None


@pytest.fixture(scope="session")
def sandboxd(tmp_path_factory: pytest.TempPathFactory):
    """A running ``sandboxd dev``; sets CWSANDBOX_BASE_URL / CWSANDBOX_API_KEY for the client."""
    global _LOG_PATH
    binary = _check_binary()

    own_data_dir = not os.environ.get("SANDBOXD_DATA_DIR")
    if own_data_dir:
        data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sandboxd-conformance-"))
    else:
        data_dir = pathlib.Path(os.environ["SANDBOXD_DATA_DIR"])
        data_dir.mkdir(parents=True, exist_ok=True)
    log_path = tmp_path_factory.mktemp("sandboxd") / "sandboxd.log"
    port = _free_port()
    listen = f"127.0.0.1:{port}"
    # A port of its own for the direct data plane, so clients in AUTO mode (the default) take
    # the direct path whatever else runs on this machine.
    data_plane = f"127.0.0.1:{_free_port()}"
    # And for the edge, so that endpoint tests reach it whatever else holds 8443.
    edge = f"127.0.0.1:{_free_port()}"
    # A bridge, subnet (so DNS address), nftables table and cgroup parent of its own: another
    # `sandboxd dev` on the host (test/security, another checkout's run) shares none of them.
    # With the defaults, the second server failed to start (DNS address taken) or rewrote the
    # first's nftables table without its rules.
    pid = os.getpid()
    bridge = f"sbxcf{pid & 0xffff:04x}"
    subnet = f"10.{100 + pid % 50}.{pid // 50 % 256}.0/24"
    cgroup_parent = f"sandboxd-conformance-{pid}"
    # -v: the direct data plane's connection lines (test_direct.py) are DEBUG (no INFO lines per exec).
    cmd = [str(binary), "dev", "-v", "--data-dir", str(data_dir), "--listen", listen, "--data-plane-listen", data_plane, "--edge-listen", edge,
           "--bridge", bridge, "--subnet", subnet, "--cgroup-parent", cgroup_parent]
    if os.environ.get("SANDBOXD_TEST_OCI_RUNTIME"):
        cmd += ["--oci-runtime", os.environ["SANDBOXD_TEST_OCI_RUNTIME"]]
    ready_timeout = float(os.environ.get("SANDBOXD_READY_TIMEOUT", "60"))

    log_f = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO)
    _LOG_PATH = log_path

    def fail_start(why: str) -> None:
        rc = _stop(proc)
        log_f.close()
        pytest.fail(
            f"`{' '.join(cmd)}` {why} (exit status {rc}).\nServer output ({log_path}):\n{_tail(log_path)}",
            pytrace=False,
        )

    # Wait for readiness.
    deadline = time.monotonic() + ready_timeout
    ready_url = f"http://{listen}/readyz"
    last_err = ""
    while True:
        if proc.poll() is not None:
            fail_start("exited before becoming ready")
        try:
            with urllib.request.urlopen(ready_url, timeout=2) as r:
                if r.status == 200:
                    break
                last_err = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last_err = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last_err = str(e)
        if time.monotonic() > deadline:
            fail_start(f"not ready after {ready_timeout:.0f}s (GET {ready_url}: {last_err})")
        time.sleep(0.2)

    key = _read_key(data_dir / "admin-api-key", time.monotonic() + 10)
    if not key:
        fail_start(f"ready but {data_dir / 'admin-api-key'} is missing or empty")

    # Prefer the URL the server printed; fall back to the address we gave it.
    m = re.search(rb"CWSANDBOX_BASE_URL=(\S+)", log_path.read_bytes())
    base_url = m.group(1).decode() if m else f"http://{listen}"

    saved = {k: os.environ.get(k) for k in ("CWSANDBOX_BASE_URL", "CWSANDBOX_API_KEY")}
    os.environ["CWSANDBOX_BASE_URL"] = base_url
    os.environ["CWSANDBOX_API_KEY"] = key
    server = Server(binary, data_dir, base_url, key, log_path, proc, data_plane=data_plane, edge=edge)
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        rc = _stop(proc)
        log_f.close()
        if rc is None:
            print(f"\nsandboxd did not stop within {STOP_TIMEOUT:.0f}s of SIGTERM and was killed; log: {log_path}")
        elif rc not in (0, -signal.SIGTERM):
            print(f"\nsandboxd exited with status {rc} after SIGTERM; tail of {log_path}:\n{_tail(log_path, lines=40)}")
        _remove_network(bridge, cgroup_parent)
        if own_data_dir:
            _remove_data_dir(data_dir)


@pytest.fixture(scope="session")
def session_tag() -> str:
    """A tag unique to this pytest session; every sandbox the suite creates carries it."""
    return f"conformance-{uuid.uuid4().hex[:12]}"


def _sweep(tag: str, auth=None) -> list[str]:
    """Delete every sandbox (any state) carrying TAG; returns the problems met."""
    from cwsandbox import Sandbox

    problems = []
    try:
        boxes = Sandbox.list(tags=[tag], show_terminated=True, auth=auth).result(timeout=60)
    except Exception as e:  # noqa: BLE001 - cleanup must not raise
        return [f"list(tags=[{tag!r}]) failed: {e!r}"]
    for sb in boxes:
        if sb.status is not None and sb.status.value in ("completed", "failed", "terminated"):
            continue
        try:
            Sandbox.delete(sb.sandbox_id, missing_ok=True, auth=auth).result(timeout=60)
        except Exception as e:  # noqa: BLE001
            problems.append(f"delete({sb.sandbox_id}) failed: {e!r}")
    return problems


@pytest.fixture(scope="session")
def client(sandboxd: Server, session_tag: str):
    """The server is up and the client environment is set; deletes the session's sandboxes at the end."""
    yield sandboxd
    problems = _sweep(session_tag)
    for key in sandboxd.extra_keys.values():
        problems += _sweep(session_tag, _auth(key))
    if problems:
        print("\nconformance cleanup problems:\n  " + "\n  ".join(problems))


@pytest.fixture(scope="session")
def other_org_key(client: Server, session_tag: str) -> str:
    """An API key (role user) of a second organization, made with ``sandboxd apikey create``."""
    org = f"conformance-other-{session_tag.rsplit('-', 1)[-1]}"
    key = client.create_api_key(org, role="user")
    client.extra_keys[org] = key
    return key


@pytest.fixture
def new_sandbox(session_tag):
    """Factory: Sandbox.run(*args, **kw) with the session tag (and ``tags``); deletes what it made
    at test end (``auth``: a per-call key, also for the delete)."""
    from cwsandbox import Sandbox

    made: list[tuple[str, object]] = []

    def run(*args, tags=(), auth=None, **kw):
        sb = Sandbox.run(*args, tags=[session_tag, *tags], auth=auth, **kw)
        assert sb.sandbox_id, "CreateSandbox returned no sandbox_id"
        made.append((sb.sandbox_id, auth))
        return sb

    yield run
    for sid, auth in made:
        try:
            Sandbox.delete(sid, missing_ok=True, auth=auth).result(timeout=30)
        except Exception:  # noqa: BLE001 - best effort; the session sweep retries
            pass


# ---------------------------------------------------------------------------------------------
# Hooks: attach the server log written during a failing test to its report.


def pytest_configure(config: pytest.Config) -> None:
    # Declared here too so the marker is known even without pytest-timeout installed.
    config.addinivalue_line("markers", "timeout(seconds): per-test timeout (pytest-timeout)")


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        import cwsandbox

        ver = cwsandbox.__version__
    except Exception:  # noqa: BLE001
        ver = "not installed"
    binary = os.environ.get("SANDBOXD_BIN") or str(REPO / "bin" / "sandboxd")
    return [f"cwsandbox client {ver}; sandboxd binary {binary}"]


_LOG_OFFSET_KEY = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _LOG_PATH is not None and _LOG_PATH.exists():
        item.stash[_LOG_OFFSET_KEY] = _LOG_PATH.stat().st_size


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _LOG_PATH is not None:
        offset = item.stash.get(_LOG_OFFSET_KEY, 0)
        text = _tail(_LOG_PATH, offset)
        if text == "(empty)":
            text = "(nothing logged during the test; last 40 lines:)\n" + _tail(_LOG_PATH, lines=40)
        rep.sections.append((f"sandboxd log during {rep.when} ({_LOG_PATH})", text))
