"""RPCs sandboxd does not build yet, through the official ``cwsandbox`` client (issue 16 §5).

Every RPC of the client's services answers with a gRPC status: those not built yet (volumes,
settings; file-system snapshots are test_snapshots.py's, templates test_templates.py's) are UNIMPLEMENTED with the AIP-193 reason
CWSANDBOX_NOT_IMPLEMENTED, which the client puts on the exception it raises (``.reason``),
instead of the raw HTTP 404 an unknown service got. The same for every protocol and REST is
cmd/sandboxd's TestNotBuiltRPCsAnswerUnimplemented.
"""

from __future__ import annotations

import pytest

cwsandbox = pytest.importorskip("cwsandbox")
from cwsandbox import Volume  # noqa: E402
from cwsandbox.exceptions import CWSandboxError  # noqa: E402

pytestmark = pytest.mark.usefixtures("client")

NOT_IMPLEMENTED = "CWSANDBOX_NOT_IMPLEMENTED"

CALLS = {
    "Volume.list": lambda: Volume.list().result(timeout=30),
    "Volume.get": lambda: Volume.get("vol-nope").result(timeout=30),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CALLS))
def test_not_built_rpc_says_so(name):
    with pytest.raises(CWSandboxError) as exc:
        CALLS[name]()
    assert exc.value.reason == NOT_IMPLEMENTED, f"{name}: {type(exc.value).__name__}: {exc.value}"
