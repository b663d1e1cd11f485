"""A runner's source-IP allowlist (control_plane_access.source_ip_allowlist), as the
official client sees it: a caller outside it cannot create a sandbox there, nor use one
that exists, and the error names the reason and the address the server saw."""

from __future__ import annotations

import pytest

from cwsandbox import Sandbox
from cwsandbox.exceptions import CWSandboxError

from test_policy import _set_policy

REASON = "CWSANDBOX_SOURCE_IP_NOT_ALLOWED"


def _refused(err: BaseException) -> None:
    # The client may wrap the error; the reason and the address are what matter.
    chain = [err]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    reasons = [getattr(e, "reason", None) for e in chain]
    text = " ".join(str(e) for e in chain)
    assert REASON in reasons or REASON in text, (reasons, text)
    assert "127.0.0.1" in text, text


@pytest.fixture
def allow_only_elsewhere(client):
    yield lambda: _set_policy(client, {"control_plane_access": {"source_ip_allowlist": ["192.0.2.1"]}})
    _set_policy(client, {})


def test_create_from_outside_the_allowlist_is_refused(allow_only_elsewhere, session_tag):
    allow_only_elsewhere()
    with pytest.raises(CWSandboxError) as caught:
        sandbox = Sandbox.run(container_image="busybox", tags=[session_tag])
        sandbox.wait()
    _refused(caught.value)


def test_existing_sandbox_follows_the_allowlist(allow_only_elsewhere, client, session_tag):
    _set_policy(client, {"control_plane_access": {"source_ip_allowlist": ["127.0.0.1", "::1"]}})
    sandbox = Sandbox.run(container_image="busybox", tags=[session_tag])
    try:
        sandbox.wait()
        assert sandbox.exec(["echo", "ok"]).result().stdout == "ok\n"
        allow_only_elsewhere()
        with pytest.raises(CWSandboxError) as caught:
            sandbox.exec(["echo", "no"]).result()
        _refused(caught.value)
    finally:
        _set_policy(client, {})
        sandbox.stop().result()
