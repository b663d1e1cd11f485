"""Compose files through the official client's ``Sandbox.run_from_file`` (CreateSandboxFromFile).

The three-service file: ``redis`` (the Debian redis test image, served as ``redis:7`` by
``sandboxd dev``'s docker.io mirror) with a ``redis-cli ping`` healthcheck; ``api`` (python)
answering ``/healthz`` 200 only once it reaches redis by its service name; ``app``, the primary,
depending on both being healthy. RUNNING means the chain passed; exec in the primary then reaches
both services by name. Refusals: a ``build:`` whose Dockerfile is in its context (the client sends no
context) names ``build_contexts[app]``; an inline one is built in a gVisor builder and runs when the
builder test image is built (CI), else is CWSANDBOX_BUILD_NOT_SUPPORTED; a refused key an invalid argument naming it, a replayed request_id with other bytes a conflict.
Container-engine control runs ``docker compose`` inside when the engine test image is built
(``scripts/build-test-images.sh engine``; CI sets SANDBOXD_ENGINE_IMAGE=1), else is a clear refusal.

The three-service test needs a backend that runs several containers per sandbox, and the redis
image (``scripts/build-test-images.sh redis``; skipped without it).
"""

from __future__ import annotations

import os
import pathlib
import uuid

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import Sandbox, SandboxStatus  # noqa: E402
from cwsandbox.exceptions import CWSandboxError, CWSandboxValidationError  # noqa: E402

pytestmark = pytest.mark.usefixtures("client")

START_TIMEOUT = 120  # three images, a healthcheck chain

REDIS_TAR = pathlib.Path(os.environ.get("SANDBOXD_CACHE", "/var/cache/sandboxd")) / "images" / "redis.tar"

API = """
import http.server, socket
def redis_ok():
    try:
        s = socket.create_connection(("redis", 6379), timeout=1)
        s.sendall(b"PING\\r\\n")
        ok = s.recv(16).startswith(b"+PONG")
        s.close()
        return ok
    except OSError:
        return False
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = redis_ok()
        self.send_response(200 if ok else 503)
        self.end_headers()
        self.wfile.write(b"redis ok" if ok else b"no redis")
http.server.ThreadingHTTPServer(("", 8000), H).serve_forever()
"""

def _three_services() -> bytes:
    import json

    return (
        """
services:
  redis:
    image: redis:7
    command: ["redis-server", "--save", "", "--appendonly", "no"]
    healthcheck:
      test: ["CMD", "redis-cli", "ping"]
      interval: 1s
      retries: 60
  api:
    image: python:3.11
    command: ["python3", "-u", "-c", %s]
    expose: ["8000"]
    depends_on:
      redis:
        condition: service_healthy
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:8000/healthz', timeout=2)"]
      interval: 1s
      retries: 60
  app:
    image: python:3.11
    command: ["sleep", "infinity"]
    depends_on:
      redis:
        condition: service_healthy
      api:
        condition: service_healthy
"""
        % json.dumps(API)
    ).encode()


ONE_SERVICE = b"""
services:
  app:
    image: python:3.11
    command: ["sleep", "infinity"]
"""


@pytest.fixture
def from_file(session_tag):
    """Factory: Sandbox.run_from_file with the session tag; deletes what it made at test end."""
    made: list[str] = []

    def run(contents: bytes, **kw):
        sb = Sandbox.run_from_file(contents, tags=[session_tag, "compose"], **kw)
        assert sb.sandbox_id, "CreateSandboxFromFile returned no sandbox_id"
        made.append(sb.sandbox_id)
        return sb

    yield run
    for sid in made:
        try:
            Sandbox.delete(sid, missing_ok=True).result(timeout=30)
        except Exception:  # noqa: BLE001 - best effort; the session sweep retries
            pass


@pytest.mark.timeout(START_TIMEOUT + 60)
def test_three_services_healthcheck_chain(from_file):
    if not REDIS_TAR.exists():
        if os.environ.get("SANDBOXD_CONFORMANCE_REQUIRED"):
            pytest.fail(f"no redis test image ({REDIS_TAR}); `make images` builds it")
        pytest.skip(f"no redis test image ({REDIS_TAR}): run scripts/build-test-images.sh redis")
    sb = from_file(_three_services(), primary_service="app")
    sb.wait(timeout=START_TIMEOUT)
    assert sb.status == SandboxStatus.RUNNING
    # The primary reaches the API by name, which answers only once it reached redis by name.
    probe = (
        "import urllib.request, socket\n"
        "print(urllib.request.urlopen('http://api:8000/healthz', timeout=5).read().decode())\n"
        "s = socket.create_connection(('redis', 6379), timeout=5); s.sendall(b'PING\\r\\n')\n"
        "print(s.recv(16).decode().strip())\n"
    )
    res = sb.exec(["python3", "-c", probe]).result(timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["redis", "ok", "+PONG"], res.stdout


@pytest.mark.timeout(90)
def test_one_service_file_runs(from_file):
    sb = from_file(ONE_SERVICE, primary_service="app")
    sb.wait(timeout=60)
    res = sb.exec(["python3", "-c", "print('from compose')"]).result(timeout=30)
    assert res.stdout.strip() == "from compose"


@pytest.mark.timeout(90)
def test_request_id_replayed_with_other_bytes_conflicts(from_file):
    rid = str(uuid.uuid4())
    first = from_file(ONE_SERVICE, primary_service="app", request_id=rid)
    again = from_file(ONE_SERVICE, primary_service="app", request_id=rid)
    assert again.sandbox_id == first.sandbox_id
    with pytest.raises(CWSandboxError) as exc:
        from_file(ONE_SERVICE + b"\n", primary_service="app", request_id=rid)
    assert exc.value.reason == "CWSANDBOX_REQUEST_ID_CONFLICT", f"{type(exc.value).__name__}: {exc.value}"


@pytest.mark.timeout(60)
def test_build_needs_an_inline_dockerfile(from_file):
    # run_from_file sends no build context: a Dockerfile in the context cannot be built.
    with pytest.raises(CWSandboxValidationError) as exc:
        from_file(b"services:\n  app:\n    build: .\n", primary_service="app")
    fields = [v.field for v in exc.value.field_violations]
    assert "build_contexts[app]" in fields, f"{exc.value}: {fields}"


BUILDER_BUILT = pathlib.Path(os.environ.get("SANDBOXD_CACHE", "/var/cache/sandboxd")) / "images" / "builder.inputs"


def _builder_expected() -> bool:
    """``sandboxd dev`` builds images when the builder test image is built (CI: always)."""
    return BUILDER_BUILT.exists() or os.environ.get("SANDBOXD_BUILDER_IMAGE") == "1"


BUILD_FILE = b"""
services:
  app:
    build:
      dockerfile_inline: |
        FROM busybox
        ARG WORD
        RUN echo "$$WORD" > /built.txt
      args: {WORD: built-by-run-from-file}
    command: ["sleep", "3600"]
"""


@pytest.mark.timeout(400)
def test_build_service_runs(from_file):
    """A ``build:`` service through the official client: the build runs inside a gVisor
    builder on ``sandboxd dev``'s runner, its image is pushed to the platform registry and
    the sandbox runs it (the RPC answers once the build is done: the client's default
    request timeout is 300 s). The same file again reuses the build."""
    if not _builder_expected():
        pytest.skip(f"no builder test image ({BUILDER_BUILT}): scripts/build-test-images.sh builder")
    sb = from_file(BUILD_FILE, primary_service="app")
    sb.wait(timeout=120)
    assert sb.status == SandboxStatus.RUNNING
    res = sb.exec(["cat", "/built.txt"]).result(timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "built-by-run-from-file\n", res.stdout
    again = from_file(BUILD_FILE, primary_service="app")
    again.wait(timeout=120)
    res = again.exec(["cat", "/built.txt"]).result(timeout=30)
    assert res.stdout == "built-by-run-from-file\n", res.stdout


@pytest.mark.timeout(120)
def test_build_without_a_builder_is_refused(from_file):
    # Without the builder test image `sandboxd dev` runs no builder (no --builder-image):
    # the build is refused, naming the service; no sandbox is created.
    if _builder_expected():
        pytest.skip("the builder test image is built: builds run (test_build_service_runs)")
    with pytest.raises(CWSandboxError) as exc:
        from_file(b"services:\n  app:\n    build:\n      dockerfile_inline: 'FROM busybox'\n", primary_service="app")
    assert exc.value.reason == "CWSANDBOX_BUILD_NOT_SUPPORTED", f"{type(exc.value).__name__}: {exc.value}"
    assert 'service "app"' in str(exc.value), str(exc.value)


@pytest.mark.timeout(60)
def test_refused_key_names_the_field(from_file):
    with pytest.raises(CWSandboxValidationError) as exc:
        from_file(b"services:\n  app:\n    image: python:3.11\n    privileged: true\n", primary_service="app")
    fields = [v.field for v in exc.value.field_violations]
    assert "services.app.privileged" in fields, f"{exc.value}: {fields}"
    assert exc.value.reason == "CWSANDBOX_INVALID_REQUEST"


ENGINE_BUILT = pathlib.Path(os.environ.get("SANDBOXD_CACHE", "/var/cache/sandboxd")) / "images" / "engine.inputs"

ENGINE_FILE = b"""
services:
  web:
    image: busybox
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 80 -h /www"]
  client:
    image: busybox
    command: ["sleep", "3600"]
    depends_on: [web]
    healthcheck:
      test: ["CMD", "sh", "-c", "nc -w 2 web 80 </dev/null"]
      interval: 1s
      timeout: 2s
      retries: 30
"""

ENGINE_COMPOSE = "docker compose -p sandbox -f /cws-engine/compose.yaml"


def _engine_expected() -> bool:
    """``sandboxd dev`` runs engines when the engine test image is built (CI: always)."""
    return ENGINE_BUILT.exists() or os.environ.get("SANDBOXD_ENGINE_IMAGE") == "1"


@pytest.mark.timeout(300)
def test_container_engine_runs_compose_inside(from_file):
    """Engine mode: docker compose inside the sandbox (Docker Engine under gVisor). RUNNING
    once both services are up (one healthy through the other by name); exec goes to
    cws-engine, where ``docker compose stop/start`` of one service work."""
    if not _engine_expected():
        pytest.skip(f"no engine test image ({ENGINE_BUILT}): scripts/build-test-images.sh engine")
    sb = from_file(ENGINE_FILE, control="container_engine")
    sb.wait(timeout=240)
    assert sb.status == SandboxStatus.RUNNING

    def sh(script: str):
        return sb.exec(["sh", "-c", script]).result(timeout=120)

    res = sh(ENGINE_COMPOSE + " ps -a --format '{{.Service}} {{.State}}' | sort")
    assert res.returncode == 0 and res.stdout == "client running\nweb running\n", (res.stdout, res.stderr)
    res = sh(ENGINE_COMPOSE + " stop web >/dev/null 2>&1 && " + ENGINE_COMPOSE + " ps -a --format '{{.Service}} {{.State}}' | sort")
    assert res.returncode == 0 and res.stdout == "client running\nweb exited\n", (res.stdout, res.stderr)
    res = sh(
        ENGINE_COMPOSE
        + " start web >/dev/null 2>&1 && docker exec sandbox-client-1 sh -c 'printf \"GET / HTTP/1.0\\r\\n\\r\\n\" | nc -w 2 web 80'"
    )
    assert res.returncode == 0 and "hello-from-web" in res.stdout, (res.stdout, res.stderr)


ENGINE_BUILD_FILE = b"""
services:
  web:
    build:
      dockerfile_inline: |
        FROM busybox
        RUN mkdir -p /www && echo built-for-the-engine > /www/index.html
    command: ["httpd", "-f", "-p", "80", "-h", "/www"]
  client:
    image: busybox
    command: ["sleep", "3600"]
    depends_on: [web]
"""


@pytest.mark.timeout(500)
def test_container_engine_runs_a_built_service(from_file):
    """Engine mode with ``build:``: the platform's builder builds the service's image (a gVisor
    builder, pushed to the platform registry); the runner pulls it with the organization's
    token and hands it to the engine, which runs it by name and tag (it builds nothing)."""
    if not _engine_expected() or not _builder_expected():
        pytest.skip("needs the engine and builder test images: scripts/build-test-images.sh engine builder")
    sb = from_file(ENGINE_BUILD_FILE, control="container_engine")
    sb.wait(timeout=240)
    assert sb.status == SandboxStatus.RUNNING
    res = sb.exec(
        ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do docker exec sandbox-client-1 sh -c 'printf \"GET / HTTP/1.0\\r\\n\\r\\n\" | nc -w 2 web 80' "
         "| grep built-for-the-engine && exit 0; sleep 1; done; exit 1"]
    ).result(timeout=120)
    assert res.returncode == 0 and "built-for-the-engine" in res.stdout, (res.stdout, res.stderr)
    res = sb.exec(["sh", "-c", "docker image ls --format '{{.Repository}}:{{.Tag}}' | grep compose-web"]).result(timeout=60)
    assert res.returncode == 0 and "/compose-web:" in res.stdout, (res.stdout, res.stderr)


@pytest.mark.timeout(60)
def test_container_engine_control_is_refused(from_file):
    """Without an engine image ``sandboxd dev``'s runner runs no engine: a clear refusal."""
    if _engine_expected():
        pytest.skip("the engine test image is built: engine mode runs (test_container_engine_runs_compose_inside)")
    with pytest.raises(CWSandboxError) as exc:
        from_file(ONE_SERVICE, control="container_engine")
    assert exc.value.reason == "CWSANDBOX_NO_SUITABLE_RUNNER", f"{type(exc.value).__name__}: {exc.value}"
    assert "CONTROL_CONTAINER_ENGINE" in str(exc.value)
