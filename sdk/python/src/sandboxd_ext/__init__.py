"""Pause, resume and fork sandboxes, and change their lifetime, with sandboxd's own API.

sandboxd serves ``sandboxd.sandbox.v1.SandboxStateService`` beside ``coreweave.sandbox.v1`` on
the same address, with the same API keys. This module calls it over REST (``POST
/v1/sandboxes/{id}:pause`` …) with the official ``cwsandbox`` client's credentials: the base
URL from ``CWSANDBOX_BASE_URL`` and the key from ``CWSANDBOX_API_KEY`` (or, when ``cwsandbox`` is
installed, whatever auth it resolves, ``set_auth_mode`` included). It needs nothing beyond the
standard library; ``cwsandbox`` is optional (its exception classes and ``Sandbox.from_id``
are used when it is importable).

    import sandboxd_ext
    from cwsandbox import Sandbox

    sb = Sandbox.run(container_image="python:3.11", runtime_class="gvisor")
    sb.wait()
    status = sandboxd_ext.pause(sb)          # or pause("sandbox-id")
    sandboxd_ext.resume(sb)
    ids = sandboxd_ext.fork(sb, count=3)     # the new sandboxes' IDs
    sandboxd_ext.fork_placed(sb, runner_ids=["r2"])  # forks on r2: IDs and runners
    res = sandboxd_ext.resume(sb, runner_ids=["r2"])  # res.runner_id, res.moved_from
    sandboxd_ext.update_lifetime(sb, extend_by=3600)

Every function takes a sandbox ID or any object with a ``sandbox_id`` attribute (an official
client ``Sandbox``). Errors raise :class:`SandboxdError` subclasses carrying the
``CWSANDBOX_*`` reason; where the official client has a matching exception class the error
is an instance of it too (``SandboxNotFoundError``, ``SandboxNotRunningError``, …).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

__all__ = [
    "MAX_FORKS",
    "AuthenticationError",
    "CheckpointNotSupportedError",
    "ForkFailure",
    "ForkedSandbox",
    "InvalidRequestError",
    "Lifetime",
    "PartialForkError",
    "PauseStatus",
    "ResumeResult",
    "SandboxNotFound",
    "SandboxNotRunning",
    "SandboxdError",
    "StateClient",
    "UnavailableError",
    "UnimplementedError",
    "fork",
    "fork_placed",
    "fork_sandboxes",
    "pause",
    "resume",
    "update_lifetime",
]

__version__ = "0.1.0"

MAX_FORKS = 100
DEFAULT_TIMEOUT = 300.0
ERROR_DOMAIN = "cwsandbox.com"
_DEFAULT_BASE_URL = "https://api.cwsandbox.com"

# ---------------------------------------------------------------------------------------------
# Errors. The official client's classes are bases where one fits, when it is importable.

try:  # pragma: no cover - exercised with and without the official client
    from cwsandbox import exceptions as _cwx
except ImportError:  # pragma: no cover
    _cwx = None


def _cw(name: str) -> type[Exception]:
    """The official client's exception class NAME, or a stand-in of our own."""
    cls = getattr(_cwx, name, None) if _cwx is not None else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls
    return type(name, (Exception,), {"__module__": __name__})


_CWSandboxError = _cw("CWSandboxError")


class SandboxdError(_CWSandboxError):  # type: ignore[misc,valid-type]
    """An error of the state API.

    Attributes:
        code: the gRPC code's name (``"NOT_FOUND"``, ``"FAILED_PRECONDITION"``, …).
        reason: the ``CWSANDBOX_*`` reason of the ``google.rpc.ErrorInfo``, or None.
        metadata: the ErrorInfo's metadata.
        http_status: the HTTP status of the REST answer (0 when none came).
        field_violations: ``(field, description)`` pairs of a ``google.rpc.BadRequest``.
        retry_delay: the ``google.rpc.RetryInfo`` delay, or None.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "UNKNOWN",
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
        http_status: int = 0,
        field_violations: tuple = (),
        retry_delay: timedelta | None = None,
        sandbox_id: str | None = None,
    ) -> None:
        # The official classes' __init__ signatures differ; set what they set directly.
        Exception.__init__(self, message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.http_status = http_status
        self.field_violations = tuple(field_violations)
        self.retry_delay = retry_delay
        self.sandbox_id = sandbox_id

    def __str__(self) -> str:
        tag = self.reason or self.code
        return f"{self.message} ({tag})" if tag else self.message


class SandboxNotFound(SandboxdError, _cw("SandboxNotFoundError")):  # type: ignore[misc]
    """NOT_FOUND ``CWSANDBOX_SANDBOX_NOT_FOUND`` (another organization's sandbox too)."""


class SandboxNotRunning(SandboxdError, _cw("SandboxNotRunningError")):  # type: ignore[misc]
    """FAILED_PRECONDITION ``CWSANDBOX_SANDBOX_NOT_RUNNING``: not running (already paused, ended),
    or paused with auto-resume off."""


class CheckpointNotSupportedError(SandboxdError, _cw("SandboxError")):  # type: ignore[misc]
    """FAILED_PRECONDITION ``CWSANDBOX_CHECKPOINT_NOT_SUPPORTED``: the sandbox's runtime class
    cannot be checkpointed (a pause releasing resources, a fork); the message names one that can."""


class InvalidRequestError(SandboxdError, _cw("CWSandboxValidationError")):  # type: ignore[misc]
    """INVALID_ARGUMENT; ``field_violations`` says which fields."""


class AuthenticationError(SandboxdError, _cw("CWSandboxAuthenticationError")):  # type: ignore[misc]
    """UNAUTHENTICATED or PERMISSION_DENIED."""


class UnavailableError(SandboxdError, _cw("SandboxUnavailableError")):  # type: ignore[misc]
    """UNAVAILABLE (or the server could not be reached); worth retrying."""


class UnimplementedError(SandboxdError):
    """UNIMPLEMENTED: the server does not serve this call (not sandboxd, or an older one)."""


@dataclass(frozen=True)
class ForkFailure:
    """One fork that failed: the ID it would have had and the error it met."""

    sandbox_id: str
    code: str
    reason: str
    message: str


@dataclass(frozen=True)
class ForkedSandbox:
    """One fork made: its ID and the runner it runs on ("" from a server that does not say)."""

    sandbox_id: str
    runner_id: str = ""


class PartialForkError(SandboxdError):
    """Some forks failed. ``sandbox_ids`` are the forks made (``forks``: with their runners),
    ``failures`` the others."""

    def __init__(self, sandbox_ids: list[str], failures: list[ForkFailure],
                 forks: list[ForkedSandbox] | None = None) -> None:
        detail = "; ".join(f"{f.sandbox_id or 'fork'}: {f.message} ({f.reason or f.code})" for f in failures)
        super().__init__(f"{len(failures)} fork(s) failed: {detail}", code="PARTIAL")
        self.sandbox_ids = list(sandbox_ids)
        self.failures = list(failures)
        self.forks = list(forks) if forks is not None else [ForkedSandbox(i) for i in sandbox_ids]

    def __str__(self) -> str:
        return self.message


_GRPC_CODES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}

_BY_REASON: dict[str, type[SandboxdError]] = {
    "CWSANDBOX_SANDBOX_NOT_FOUND": SandboxNotFound,
    "CWSANDBOX_SANDBOX_NOT_RUNNING": SandboxNotRunning,
    "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED": CheckpointNotSupportedError,
}

_BY_CODE: dict[str, type[SandboxdError]] = {
    "NOT_FOUND": SandboxNotFound,
    "INVALID_ARGUMENT": InvalidRequestError,
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": AuthenticationError,
    "UNAVAILABLE": UnavailableError,
    "UNIMPLEMENTED": UnimplementedError,
}


def _error_class(code: str, reason: str | None, domain: str | None) -> type[SandboxdError]:
    # Reasons are trusted from our domain only (as the official client gates its classes).
    if reason and domain == ERROR_DOMAIN and reason in _BY_REASON:
        return _BY_REASON[reason]
    if reason in ("CWSANDBOX_NOT_IMPLEMENTED", "CWSANDBOX_ROUTE_NOT_FOUND") and domain == ERROR_DOMAIN:
        return UnimplementedError
    if code == "NOT_FOUND" and reason and domain == ERROR_DOMAIN:
        return SandboxdError  # some other thing not found
    return _BY_CODE.get(code, SandboxdError)


def _parse_duration(s: Any) -> timedelta | None:
    if isinstance(s, str) and s.endswith("s"):
        try:
            return timedelta(seconds=float(s[:-1]))
        except ValueError:
            return None
    return None


def _error_from_body(status: int, body: bytes, sandbox_id: str | None) -> SandboxdError:
    """The google.rpc.Status JSON of a REST error as a SandboxdError."""
    try:
        st = json.loads(body.decode("utf-8"))
        if not isinstance(st, dict):
            raise ValueError("not an object")
    except ValueError:
        text = body.decode("utf-8", errors="replace").strip()[:200]
        code = {404: "NOT_FOUND", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}.get(status, "UNKNOWN")
        return _BY_CODE.get(code, SandboxdError)(f"HTTP {status}: {text or 'no body'}", code=code, http_status=status, sandbox_id=sandbox_id)
    raw_code = st.get("code", 2)
    code = _GRPC_CODES.get(raw_code, "UNKNOWN") if isinstance(raw_code, int) else str(raw_code).upper()
    reason = domain = None
    metadata: dict[str, str] = {}
    violations: list = []
    retry_delay = None
    for d in st.get("details") or []:
        if not isinstance(d, dict):
            continue
        t = str(d.get("@type", ""))
        if t.endswith("google.rpc.ErrorInfo") and d.get("reason") and reason is None:
            reason, domain = str(d["reason"]), str(d.get("domain", ""))
            metadata = {str(k): str(v) for k, v in (d.get("metadata") or {}).items()}
        elif t.endswith("google.rpc.BadRequest"):
            for fv in d.get("fieldViolations") or []:
                violations.append(_field_violation(str(fv.get("field", "")), str(fv.get("description", ""))))
        elif t.endswith("google.rpc.RetryInfo"):
            retry_delay = _parse_duration(d.get("retryDelay"))
    cls = _error_class(code, reason, domain)
    return cls(str(st.get("message") or code), code=code, reason=reason, metadata=metadata, http_status=status,
               field_violations=tuple(violations), retry_delay=retry_delay, sandbox_id=sandbox_id)


def _field_violation(field_name: str, description: str) -> Any:
    fv = getattr(_cwx, "FieldViolation", None) if _cwx is not None else None
    if fv is not None:
        try:
            return fv(field=field_name, description=description)
        except TypeError:  # pragma: no cover - another client version
            pass
    return (field_name, description)


# ---------------------------------------------------------------------------------------------
# Results.


def _timestamp(v: Any) -> datetime | None:
    if not isinstance(v, str) or not v:
        return None
    s = v.replace("Z", "+00:00")
    # protojson writes 0, 3, 6 or 9 fractional digits; datetime takes at most 6.
    head, sep, frac = s.partition(".")
    if sep:
        digits = frac[: len(frac) - len(frac.lstrip("0123456789"))]
        s = head + "." + digits[:6].ljust(6, "0") + frac[len(digits):]
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


def _int(v: Any) -> int:
    """An int64 of protojson (a string) or a number."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class PauseStatus:
    """How a sandbox is paused."""

    sandbox_id: str
    #: checkpointed, CPU and memory released; False: frozen, memory kept and counted.
    resources_released: bool
    auto_resume: bool
    #: the lifetime does not count while paused.
    lifetime_held: bool
    paused_at: datetime | None
    #: the checkpoint's size on the runner's disk; 0 when frozen.
    checkpoint_bytes: int


@dataclass(frozen=True)
class ResumeResult:
    sandbox_id: str
    #: when the sandbox's lifetime now ends.
    deadline: datetime | None
    #: the runner it runs on now ("" from a server that does not say).
    runner_id: str = ""
    #: the runner it ran on before, when it moved to ``runner_id``; "" when it resumed in place.
    moved_from: str = ""


@dataclass(frozen=True)
class Lifetime:
    #: the total lifetime, counted from the sandbox's creation.
    max_lifetime_seconds: int
    deadline: datetime | None


# ---------------------------------------------------------------------------------------------
# The client.


def _sandbox_id(sandbox: Any) -> str:
    sid = sandbox if isinstance(sandbox, str) else getattr(sandbox, "sandbox_id", None)
    if not isinstance(sid, str) or not sid:
        raise ValueError(f"want a sandbox ID or an object with a sandbox_id, got {sandbox!r}")
    return sid


def _runner_ids(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"runner_ids must be a list of runner IDs, got {type(v).__name__}")
    out = list(v)
    for r in out:
        if not isinstance(r, str) or not r:
            raise ValueError(f"runner_ids must be non-empty strings, got {r!r}")
    return out


def _seconds(name: str, v: Any) -> int:
    if isinstance(v, timedelta):
        if v % timedelta(seconds=1):
            raise ValueError(f"{name} must be whole seconds, got {v}")
        return int(v.total_seconds())
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int (seconds) or a timedelta, got {type(v).__name__}")
    return v


@dataclass
class StateClient:
    """A client of SandboxStateService.

    Args:
        base_url: the API's URL (default: ``CWSANDBOX_BASE_URL``, else the official client's
            default).
        api_key: sent as ``Authorization: Bearer``. Default: ``auth``, else the official
            client's resolved auth (``CWSANDBOX_API_KEY``, or its ``set_auth_mode``), else
            ``CWSANDBOX_API_KEY``.
        auth: an official-client ``AuthConfig`` (``AuthHeaders``, ``AuthStrategy``, provider).
        timeout: seconds per request.
    """

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    auth: Any = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    _resolved_url: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        url = self.base_url or os.environ.get("CWSANDBOX_BASE_URL") or _default_base_url()
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"base URL must be http(s)://host[:port], got {url!r}")
        self._resolved_url = url.rstrip("/")

    # -- credentials ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key}"}
        try:
            from cwsandbox import _auth as cwauth
        except ImportError:
            cwauth = None
        if cwauth is not None and hasattr(cwauth, "resolve_auth"):
            try:
                resolved = cwauth.resolve_auth(self.auth, base_url=self._resolved_url)
            except TypeError:  # an older client: resolve_auth() takes no arguments
                resolved = cwauth.resolve_auth()
            return dict(resolved.headers)
        if self.auth is not None and hasattr(self.auth, "headers"):
            return dict(self.auth.headers)
        key = os.environ.get("CWSANDBOX_API_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _call(self, sandbox_id: str, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self._resolved_url}/v1/sandboxes/{urllib.parse.quote(sandbox_id, safe='')}:{verb}"
        headers = {"Content-Type": "application/json", "Accept": "application/json", **self._headers()}
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                data = res.read()
        except urllib.error.HTTPError as e:
            raise _error_from_body(e.code, e.read(), sandbox_id) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise UnavailableError(f"{url}: {reason}", code="UNAVAILABLE", sandbox_id=sandbox_id) from e
        try:
            out = json.loads(data.decode("utf-8") or "{}")
        except ValueError as e:
            raise SandboxdError(f"{url}: the answer is not JSON", code="INTERNAL", sandbox_id=sandbox_id) from e
        if not isinstance(out, dict):
            raise SandboxdError(f"{url}: the answer is not a JSON object", code="INTERNAL", sandbox_id=sandbox_id)
        return out

    # -- calls ----------------------------------------------------------------------------

    def pause(self, sandbox: Any, release_resources: bool | None = None, auto_resume: bool | None = None) -> PauseStatus:
        """Pause a running sandbox; see the module's :func:`pause`."""
        sid = _sandbox_id(sandbox)
        body: dict[str, Any] = {}
        if release_resources is not None:
            body["releaseResources"] = bool(release_resources)
        if auto_resume is not None:
            body["autoResume"] = bool(auto_resume)
        st = self._call(sid, "pause", body).get("status") or {}
        return PauseStatus(
            sandbox_id=str(st.get("sandboxId") or sid),
            resources_released=bool(st.get("resourcesReleased", False)),
            auto_resume=bool(st.get("autoResume", False)),
            lifetime_held=bool(st.get("lifetimeHeld", False)),
            paused_at=_timestamp(st.get("pausedAt")),
            checkpoint_bytes=_int(st.get("checkpointBytes", 0)),
        )

    def resume(self, sandbox: Any, runner_ids: list[str] | None = None) -> ResumeResult:
        """Resume a paused sandbox; see the module's :func:`resume`."""
        sid = _sandbox_id(sandbox)
        body: dict[str, Any] = {}
        runners = _runner_ids(runner_ids)
        if runners:
            body["runnerIds"] = runners
        out = self._call(sid, "resume", body)
        return ResumeResult(sandbox_id=str(out.get("sandboxId") or sid), deadline=_timestamp(out.get("deadline")),
                            runner_id=str(out.get("runnerId") or ""), moved_from=str(out.get("movedFrom") or ""))

    def fork(self, sandbox: Any, count: int = 1, request_id: str | None = None,
             runner_ids: list[str] | None = None) -> list[str]:
        """Fork a sandbox COUNT times; see the module's :func:`fork`."""
        return [f.sandbox_id for f in self.fork_placed(sandbox, count, request_id, runner_ids)]

    def fork_placed(self, sandbox: Any, count: int = 1, request_id: str | None = None,
                    runner_ids: list[str] | None = None) -> list[ForkedSandbox]:
        """:meth:`fork`, returning each fork's ID and runner."""
        sid = _sandbox_id(sandbox)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            raise ValueError(f"count must be an int in 1..{MAX_FORKS}, got {count!r}")
        body: dict[str, Any] = {"count": count}
        if request_id:
            body["requestId"] = str(request_id)
        runners = _runner_ids(runner_ids)
        if runners:
            body["runnerIds"] = runners
        forks = self._call(sid, "fork", body).get("forks") or []
        made: list[ForkedSandbox] = []
        failed: list[ForkFailure] = []
        for f in forks:
            if not isinstance(f, dict):
                continue
            err = f.get("error")
            if err:
                failed.append(ForkFailure(str(f.get("sandboxId", "")), str(err.get("code", "UNKNOWN")),
                                          str(err.get("reason", "")), str(err.get("message", ""))))
            elif f.get("sandboxId"):
                made.append(ForkedSandbox(str(f["sandboxId"]), str(f.get("runnerId") or "")))
            else:
                failed.append(ForkFailure("", "INTERNAL", "", "the server returned a fork without an ID"))
        if len(made) + len(failed) != count:
            failed.append(ForkFailure("", "INTERNAL", "", f"asked for {count} forks, the server answered {len(made) + len(failed)}"))
        if failed:
            raise PartialForkError([f.sandbox_id for f in made], failed, made)
        return made

    def fork_sandboxes(self, sandbox: Any, count: int = 1, request_id: str | None = None,
                       runner_ids: list[str] | None = None) -> list[Any]:
        """:meth:`fork`, then the official client's ``Sandbox`` of each fork (``Sandbox.from_id``)."""
        try:
            from cwsandbox import Sandbox
        except ImportError as e:  # pragma: no cover
            raise RuntimeError("fork_sandboxes needs the official cwsandbox client") from e
        ids = self.fork(sandbox, count=count, request_id=request_id, runner_ids=runner_ids)
        kw: dict[str, Any] = {"base_url": self._resolved_url}
        if self.api_key:
            from cwsandbox import AuthHeaders

            kw["auth"] = AuthHeaders(headers={"Authorization": f"Bearer {self.api_key}"}, strategy="api_key")
        elif self.auth is not None:
            kw["auth"] = self.auth
        return [Sandbox.from_id(i, **kw).result() for i in ids]

    def update_lifetime(self, sandbox: Any, *, extend_by: int | timedelta | None = None,
                        max_lifetime: int | timedelta | None = None) -> Lifetime:
        """Change a running sandbox's lifetime; see the module's :func:`update_lifetime`."""
        sid = _sandbox_id(sandbox)
        if (extend_by is None) == (max_lifetime is None):
            raise ValueError("give exactly one of extend_by or max_lifetime")
        if extend_by is not None:
            body = {"extendBySeconds": _seconds("extend_by", extend_by)}
        else:
            body = {"maxLifetimeSeconds": _seconds("max_lifetime", max_lifetime)}
        out = self._call(sid, "updateLifetime", body)
        return Lifetime(max_lifetime_seconds=_int(out.get("maxLifetimeSeconds", 0)), deadline=_timestamp(out.get("deadline")))


def _default_base_url() -> str:
    try:
        from cwsandbox._defaults import DEFAULT_BASE_URL

        return str(DEFAULT_BASE_URL)
    except ImportError:  # pragma: no cover
        return _DEFAULT_BASE_URL


# ---------------------------------------------------------------------------------------------
# Module-level functions, with a client from the environment.


def pause(sandbox: Any, release_resources: bool | None = None, auto_resume: bool | None = None, **client: Any) -> PauseStatus:
    """Pause a RUNNING sandbox: PAUSED in ``Sandbox.get``/``status`` until resumed.

    ``release_resources``: None checkpoints where the runtime class can (gvisor: CPU and memory
    released) and freezes otherwise (runc: memory kept and counted); True checkpoints or raises
    :class:`CheckpointNotSupportedError`; False freezes. ``auto_resume``: whether exec, file calls
    and endpoint traffic resume it first (None: the runner policy's, default on); off, they fail
    with the official client's ``SandboxNotRunningError``. Pausing a sandbox not running (already
    paused included) raises :class:`SandboxNotRunning`. ``client``: :class:`StateClient` arguments.
    """
    return StateClient(**client).pause(sandbox, release_resources=release_resources, auto_resume=auto_resume)


def resume(sandbox: Any, runner_ids: list[str] | None = None, **client: Any) -> ResumeResult:
    """Resume a PAUSED sandbox under the same ID (a RUNNING one is left as it is); its processes
    continue where they were. A checkpointed sandbox resumes on its own runner when that is in
    ``runner_ids`` (or none are given) and has room; otherwise it moves, through the blob store,
    to a listed runner able to restore it, keeping its ID, files, memory and processes, with that
    runner's address and endpoint host names: ``runner_id`` says where it runs, ``moved_from``
    where it ran before a move. A frozen (runc) sandbox cannot move."""
    return StateClient(**client).resume(sandbox, runner_ids=runner_ids)


def fork(sandbox: Any, count: int = 1, request_id: str | None = None, runner_ids: list[str] | None = None,
         **client: Any) -> list[str]:
    """Make COUNT (1..100) copies of a RUNNING or PAUSED sandbox, each with its own ID, address and
    endpoints; returns their IDs. A runtime class that cannot checkpoint raises
    :class:`CheckpointNotSupportedError`; when only some forks failed, :class:`PartialForkError`
    carries the IDs made (``sandbox_ids``) and the ``failures``. ``request_id`` makes it
    idempotent (the same request again returns the same forks). ``runner_ids``: the runners the
    forks may go to (None: any); the source's when allowed with room, else others, through the
    blob store. :func:`fork_placed` returns each fork's runner too."""
    return StateClient(**client).fork(sandbox, count=count, request_id=request_id, runner_ids=runner_ids)


def fork_placed(sandbox: Any, count: int = 1, request_id: str | None = None, runner_ids: list[str] | None = None,
                **client: Any) -> list[ForkedSandbox]:
    """:func:`fork`, returning each fork's ID and the runner it runs on."""
    return StateClient(**client).fork_placed(sandbox, count=count, request_id=request_id, runner_ids=runner_ids)


def fork_sandboxes(sandbox: Any, count: int = 1, request_id: str | None = None, runner_ids: list[str] | None = None,
                   **client: Any) -> list[Any]:
    """:func:`fork`, returning the official client's ``Sandbox`` objects."""
    return StateClient(**client).fork_sandboxes(sandbox, count=count, request_id=request_id, runner_ids=runner_ids)


def update_lifetime(sandbox: Any, *, extend_by: int | timedelta | None = None,
                    max_lifetime: int | timedelta | None = None, **client: Any) -> Lifetime:
    """Extend (``extend_by`` seconds; negative shortens) or set (``max_lifetime``, counted from
    the sandbox's creation) a running sandbox's lifetime within its runner policy's maximum."""
    return StateClient(**client).update_lifetime(sandbox, extend_by=extend_by, max_lifetime=max_lifetime)
