"""Wire compatibility of our coreweave.sandbox.v1 protos with the official cwsandbox client.

The client ships the descriptors of the protocol it speaks (its generated ``*_pb2`` modules). We
build our own descriptors from api/ with buf and require that, for every service in SERVICES (all
the coreweave.sandbox.v1 services the client ships; test_every_client_service_checked fails when a
client adds one), everything the client knows exists identically in ours: methods (name, types,
streaming), every field of every message reachable from them (number, name, type, type_name, label,
oneof membership, proto3 optional, JSON name), enum values, and the google.api.http annotations
used for REST transcoding. Extra fields/values on our side are
allowed and only reported.

Needs: Go (for ``go tool -modfile=tools/go.mod buf``) and ``pip install -r requirements.txt``.
Run: ``pytest -v test/conformance/test_wire.py`` (add ``-s`` to see the informational report).
"""

from __future__ import annotations

import importlib
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
from google.api import annotations_pb2  # registers the google.api.http extension for parsing
from google.protobuf import descriptor_pb2, text_format

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "coreweave.sandbox.v1"
SERVICES = (
    "SandboxService",
    "DiscoveryService",
    "SandboxDataPlaneService",
    "SandboxTemplateService",
    "VolumeService",
    "SettingsService",
)

FDP = descriptor_pb2.FieldDescriptorProto
TYPE_NAMES = {v: k.removeprefix("TYPE_").lower() for k, v in FDP.Type.items()}
LABEL_NAMES = {v: k.removeprefix("LABEL_").lower() for k, v in FDP.Label.items()}


class Schema:
    """Fully qualified name -> descriptor proto, for one set of files."""

    def __init__(self, files: list[descriptor_pb2.FileDescriptorProto]):
        self.files = {f.name: f for f in files}
        self.messages: dict[str, descriptor_pb2.DescriptorProto] = {}
        self.enums: dict[str, descriptor_pb2.EnumDescriptorProto] = {}
        self.services: dict[str, descriptor_pb2.ServiceDescriptorProto] = {}
        self.message_file: dict[str, str] = {}
        for f in files:
            prefix = "." + f.package if f.package else ""
            for m in f.message_type:
                self._add_message(prefix, m, f.name)
            for e in f.enum_type:
                self.enums[f"{prefix}.{e.name}"] = e
            for s in f.service:
                self.services[f"{prefix}.{s.name}"] = s

    def _add_message(self, prefix: str, m: descriptor_pb2.DescriptorProto, file: str) -> None:
        name = f"{prefix}.{m.name}"
        self.messages[name] = m
        self.message_file[name] = file
        for n in m.nested_type:
            self._add_message(name, n, file)
        for e in m.enum_type:
            self.enums[f"{name}.{e.name}"] = e


def _ours() -> Schema:
    go = os.environ.get("GO") or shutil.which("go")
    if not go:
        pytest.fail("Go toolchain not found (needed to build our descriptors with buf)")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="sandboxd-wire-")) / "ours.binpb"
    cmd = [go, "tool", "-modfile=tools/go.mod", "buf", "build", "--as-file-descriptor-set", "-o", str(tmp)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"`{' '.join(cmd)}` failed:\n{res.stdout}{res.stderr}")
    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(tmp.read_bytes())
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)
    return Schema(list(fds.file))


def _client_pb2_modules() -> list[str]:
    """Module names of the client's generated *_pb2.py files (found on disk, not hard-coded)."""
    import cwsandbox

    root = pathlib.Path(cwsandbox.__file__).parent
    mods = []
    for path in sorted(root.rglob("*_pb2.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        mods.append(".".join(rel.parts))
    return mods


def _theirs() -> Schema:
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}

    def add(fd) -> None:
        if fd.name in files:
            return
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        files[fd.name] = proto
        for dep in fd.dependencies:
            add(dep)

    mods = _client_pb2_modules()
    if not mods:
        pytest.fail("no *_pb2.py modules found in the installed cwsandbox package")
    for name in mods:
        add(importlib.import_module(name).DESCRIPTOR)
    return Schema(list(files.values()))


@pytest.fixture(scope="module")
def ours() -> Schema:
    return _ours()


@pytest.fixture(scope="module")
def theirs() -> Schema:
    return _theirs()


def _reachable(schema: Schema) -> tuple[list[str], list[str]]:
    """Messages and enums reachable from the methods of SERVICES, in discovery order."""
    msgs: list[str] = []
    enums: list[str] = []
    todo: list[str] = []
    for svc in SERVICES:
        for m in schema.services[f".{PACKAGE}.{svc}"].method:
            todo += [m.input_type, m.output_type]
    while todo:
        name = todo.pop(0)
        if name in msgs:
            continue
        msgs.append(name)
        msg = schema.messages[name]
        for f in msg.field:
            if f.type == FDP.TYPE_MESSAGE:
                todo.append(f.type_name)
            elif f.type == FDP.TYPE_ENUM and f.type_name not in enums:
                enums.append(f.type_name)
    return msgs, enums


def _field_sig(msg: descriptor_pb2.DescriptorProto, f: FDP) -> dict[str, object]:
    oneof = msg.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
    return {
        "number": f.number,
        "name": f.name,
        "type": TYPE_NAMES[f.type],
        "type_name": f.type_name or None,
        "label": LABEL_NAMES[f.label],
        "oneof": oneof,
        "proto3_optional": f.proto3_optional,
        "json_name": f.json_name or None,
    }


def _fmt_sig(sig: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sig.items())


def _fail(title: str, problems: list[str]) -> None:
    if problems:
        pytest.fail(f"{title}: {len(problems)} difference(s) (client = theirs, api/ = ours)\n  - "
                    + "\n  - ".join(problems), pytrace=False)


def test_client_descriptors_found(theirs: Schema) -> None:
    for svc in SERVICES:
        assert f".{PACKAGE}.{svc}" in theirs.services, f"client has no {PACKAGE}.{svc}"


def test_every_client_service_checked(theirs: Schema) -> None:
    """A service the client ships but SERVICES leaves out would go unchecked (and unserved)."""
    unchecked = sorted({s[1:] for s in theirs.services if s.startswith(f".{PACKAGE}.")}
                       - {f"{PACKAGE}.{s}" for s in SERVICES})
    assert not unchecked, f"the client ships services this test does not check: {', '.join(unchecked)}"


@pytest.mark.parametrize("service", SERVICES)
def test_methods(service: str, ours: Schema, theirs: Schema) -> None:
    full = f".{PACKAGE}.{service}"
    if full not in ours.services:
        _fail(service, [f"service {full[1:]} missing in ours"])
    mine = {m.name: m for m in ours.services[full].method}
    problems = []
    for m in theirs.services[full].method:
        o = mine.get(m.name)
        if o is None:
            problems.append(f"{service}.{m.name}: method missing in ours")
            continue
        for attr in ("input_type", "output_type", "client_streaming", "server_streaming"):
            if getattr(o, attr) != getattr(m, attr):
                problems.append(f"{service}.{m.name}: {attr} theirs={getattr(m, attr)!r} ours={getattr(o, attr)!r}")
    _fail(f"methods of {service}", problems)


@pytest.mark.parametrize("service", SERVICES)
def test_http_annotations(service: str, ours: Schema, theirs: Schema) -> None:
    full = f".{PACKAGE}.{service}"
    mine = {m.name: m for m in ours.services[full].method}
    problems = []
    for m in theirs.services[full].method:
        if m.name not in mine:
            continue  # reported by test_methods
        t = m.options.Extensions[annotations_pb2.http]
        o = mine[m.name].options.Extensions[annotations_pb2.http]
        if t != o:
            show = lambda r: text_format.MessageToString(r, as_one_line=True) or "(none)"  # noqa: E731
            problems.append(f"{service}.{m.name}: google.api.http theirs: {show(t)} | ours: {show(o)}")
    _fail(f"google.api.http annotations of {service}", problems)


def test_messages(ours: Schema, theirs: Schema) -> None:
    msgs, _ = _reachable(theirs)
    problems = []
    for name in msgs:
        t = theirs.messages[name]
        o = ours.messages.get(name)
        if o is None:
            problems.append(f"{name[1:]}: message missing in ours")
            continue
        if t.options.map_entry != o.options.map_entry:
            problems.append(f"{name[1:]}: map_entry theirs={t.options.map_entry} ours={o.options.map_entry}")
        mine = {f.number: f for f in o.field}
        for f in t.field:
            want = _field_sig(t, f)
            if f.number not in mine:
                problems.append(f"{name[1:]} field {f.number} ({f.name}) missing in ours; theirs: {_fmt_sig(want)}")
                continue
            got = _field_sig(o, mine[f.number])
            diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
            if diff:
                problems.append(f"{name[1:]} field {f.number} ({f.name}): "
                                + "; ".join(f"{k} theirs={a!r} ours={b!r}" for k, (a, b) in diff.items()))
        # A field name must not be reused under another number, and our extra fields must not
        # collide with numbers the client reserves.
        their_names = {f.name: f.number for f in t.field}
        for f in o.field:
            if f.name in their_names and their_names[f.name] != f.number:
                problems.append(f"{name[1:]}: field name {f.name} is {their_names[f.name]} in theirs, {f.number} in ours")
            if any(r.start <= f.number < r.end for r in t.reserved_range) or f.name in t.reserved_name:
                problems.append(f"{name[1:]}: our field {f.number} ({f.name}) is reserved by the client")
    _fail("messages reachable from " + "/".join(SERVICES), problems)


def test_enums(ours: Schema, theirs: Schema) -> None:
    _, enums = _reachable(theirs)
    problems = []
    for name in enums:
        t = theirs.enums[name]
        o = ours.enums.get(name)
        if o is None:
            problems.append(f"{name[1:]}: enum missing in ours")
            continue
        mine = {v.number: v.name for v in o.value}
        for v in t.value:
            if mine.get(v.number) != v.name:
                problems.append(f"{name[1:]} value {v.number}: theirs={v.name} ours={mine.get(v.number)}")
    _fail("enums reachable from " + "/".join(SERVICES), problems)


def test_report_extras(ours: Schema, theirs: Schema) -> None:
    """Informational only: what we define beyond the client's view (allowed)."""
    msgs, enums = _reachable(theirs)
    lines = []
    for name in msgs:
        if name in ours.messages:
            known = {f.number for f in theirs.messages[name].field}
            for f in ours.messages[name].field:
                if f.number not in known:
                    lines.append(f"extra field {name[1:]}.{f.name} = {f.number}")
    for name in enums:
        if name in ours.enums:
            known = {v.number for v in theirs.enums[name].value}
            lines += [f"extra enum value {name[1:]}.{v.name} = {v.number}" for v in ours.enums[name].value
                      if v.number not in known]
    for full in (f".{PACKAGE}.{s}" for s in SERVICES):
        if full in ours.services:
            known = {m.name for m in theirs.services[full].method}
            lines += [f"extra method {full[1:]}.{m.name}" for m in ours.services[full].method if m.name not in known]
    print("\n[wire-compat info] " + ("\n[wire-compat info] ".join(lines) if lines else "no extras"))
