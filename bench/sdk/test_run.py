"""run.py's own files: nothing of a run is left in the temp dir but a failed run's server
log, whose path it prints. No root, no server: `python3 -m pytest -q bench/sdk`."""

import pathlib
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run  # noqa: E402


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    """The temp dir (tempfile's) the run's files go to, empty."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def fake_repo(tmp_path: pathlib.Path, monkeypatch) -> None:
    """run.REPO with a bin/sandboxd that exits at once, and a `go build` that writes the
    Go SDK's binary without building it."""
    repo = tmp_path.parent / (tmp_path.name + "-repo")
    (repo / "bin").mkdir(parents=True)
    sandboxd = repo / "bin" / "sandboxd"
    sandboxd.write_text("#!/bin/sh\necho 'sandboxd dev: cannot start (test)'\nexit 3\n")
    sandboxd.chmod(0o755)
    monkeypatch.setattr(run, "REPO", repo)
    real = subprocess.run

    def fake_run(argv, *a, **kw):
        if argv[:2] == ["go", "build"]:
            out = pathlib.Path(argv[argv.index("-o") + 1])
            out.write_text("gosdk")
            return subprocess.CompletedProcess(argv, 0)
        return real(argv, *a, **kw)

    monkeypatch.setattr(subprocess, "run", fake_run)


def test_failed_run_keeps_only_its_log(tmp, monkeypatch, capsys):
    fake_repo(tmp, monkeypatch)
    with pytest.raises(SystemExit, match="sandboxd dev exited"):
        run.run([])
    left = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*"))
    (work,) = [p for p in tmp.iterdir() if p.name.startswith("bench-sdk-")]
    log = work / "sandboxd-dev.log"
    assert left == [work.name, f"{work.name}/sandboxd-dev.log"], left
    assert "cannot start (test)" in log.read_text()
    assert f"the server's log is kept: {log}" in capsys.readouterr().out


def test_files_removed_after_a_good_run(tmp):
    files = run.RunFiles()
    files.gosdk.write_text("gosdk")
    files.log.write_text("log")
    files.close(ok=True)
    assert list(tmp.iterdir()) == []


def test_files_of_a_failed_measurement_keep_the_log(tmp, capsys):
    files = run.RunFiles()
    files.gosdk.write_text("gosdk")
    files.log.write_text("log")
    files.failed = True
    files.close(ok=True)
    assert sorted(p.name for p in files.dir.iterdir()) == ["sandboxd-dev.log"]
    assert str(files.log) in capsys.readouterr().out
