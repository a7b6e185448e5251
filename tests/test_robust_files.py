"""Issue 22, files: an in-place write (a hard-linked file) is journalled, so that a run killed
between its two steps (write, truncate) is undone by the next run; a full disk or a short
write rolls back at once; one file under two names is written once.

The kills are real: a subprocess runs the real CLI with one `os` function replaced by a
SIGKILL of itself (the fault injection), and the next run is the real CLI again."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ampfix.engine import fileio, runner, signals
from tests.conftest import ROOT, run_ampfix

# the unsafe fix removes `.half()`: the fixed file is shorter than the original, so an
# interrupted in-place write leaves the old tail after the new end
BAD = (ROOT / "fixtures" / "rules" / "AMP011" / "bad_script.py").read_text()
FIXED = (ROOT / "fixtures" / "rules" / "AMP011" / "bad_script.unsafe.py").read_text()
CLIP = ("import torch\n\ndef step(model, optimizer, scaler, loss):\n    scaler.scale(loss).backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    scaler.step(optimizer)\n    scaler.update()\n")

KILLER = textwrap.dedent("""\
    import os, signal, sys
    from ampfix.engine import fileio

    where = sys.argv.pop(1)
    real = {"ftruncate": os.ftruncate, "write": os.write, "unlink": os.unlink}

    def kill(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "between":  # the new bytes are written, the truncate is not done
        os.ftruncate = kill
    elif where == "mid-write":  # half of the new bytes written (the journal itself is written whole)
        def half(fd, data):
            if os.fstat(fd).st_nlink > 1:
                real["write"](fd, bytes(data[: len(data) // 2]))
                kill()
            return real["write"](fd, data)
        os.write = half
    elif where == "after":  # the file is complete, the journal not yet removed
        def unlink(path, *a, **k):
            if str(path).endswith(fileio.JOURNAL_SUFFIX):
                kill()
            return real["unlink"](path, *a, **k)
        os.unlink = unlink
    from ampfix.frontends.cli import main
    main(sys.argv[1:], prog_name="ampfix")
    """)


def _killed_rewrite(tmp_path, where, *paths):
    script = tmp_path / "bin" / "killer.py"  # its folder comes first on sys.path: not the files' folder
    script.parent.mkdir(exist_ok=True)
    script.write_text(KILLER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(script), where, "rewrite", "--unsafe-fixes", "--no-cache", *paths],
                          cwd=tmp_path, capture_output=True, env=env, timeout=300)


def _linked(tmp_path, text=BAD):
    (tmp_path / "src").mkdir()
    a = tmp_path / "src" / "train.py"
    a.write_text(text)
    b = tmp_path / "other_name.py"
    os.link(a, b)
    return a, b


def _journals(tmp_path):
    return sorted(p.name for p in tmp_path.rglob("*" + fileio.JOURNAL_SUFFIX))


def _temps(tmp_path):
    return sorted(p.name for p in tmp_path.rglob("*" + fileio.TEMP_SUFFIX))


@pytest.mark.parametrize("where", ["between", "mid-write"])
def test_a_kill_during_the_in_place_write_is_undone_by_the_next_run(tmp_path, where):
    a, b = _linked(tmp_path)
    killed = _killed_rewrite(tmp_path, where, "src/train.py")
    assert killed.returncode == -signal.SIGKILL
    broken = a.read_bytes()
    assert broken != BAD.encode() and broken != FIXED.encode()  # half written: the damage is real
    if where == "between":
        assert broken == FIXED.encode() + BAD.encode()[len(FIXED.encode()):]  # the old tail after the new end
    assert _journals(tmp_path) == [".train.py.ampfix.journal"]
    # the next run - a plain check - notices, restores the file (both names), and reports it
    res = run_ampfix("check", "--no-cache", "src/train.py", "other_name.py", cwd=tmp_path)
    err = res.stderr.decode().splitlines()
    assert err == ["src/train.py: warning: restored as it was before an interrupted rewrite (the file was half "
                   "written; from its journal)"]
    assert res.returncode == 1 and res.stdout.decode().count("AMP011") == 2
    assert a.read_text() == b.read_text() == BAD and os.stat(a).st_ino == os.stat(b).st_ino
    assert _journals(tmp_path) == [] and _temps(tmp_path) == []
    # and a rewrite now completes
    res = run_ampfix("rewrite", "--unsafe-fixes", "src/train.py", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert a.read_text() == b.read_text() == FIXED and os.stat(a).st_nlink == 2


def test_the_journal_is_found_through_the_other_hard_link_in_the_same_folder(tmp_path):
    (tmp_path / "train.py").write_text(BAD)
    os.link(tmp_path / "train.py", tmp_path / "twin.py")
    assert _killed_rewrite(tmp_path, "between", "train.py").returncode == -signal.SIGKILL
    res = run_ampfix("rewrite", "--unsafe-fixes", "train.py", "twin.py", cwd=tmp_path)  # restores first
    assert "train.py: warning: restored as it was before an interrupted rewrite" in res.stderr.decode()
    assert (tmp_path / "train.py").read_text() == (tmp_path / "twin.py").read_text() == FIXED
    assert _journals(tmp_path) == []


def test_a_kill_after_the_write_leaves_a_complete_file_and_the_journal_goes_quietly(tmp_path):
    a, b = _linked(tmp_path)
    assert _killed_rewrite(tmp_path, "after", "src/train.py").returncode == -signal.SIGKILL
    assert a.read_text() == FIXED and _journals(tmp_path) == [".train.py.ampfix.journal"]
    res = run_ampfix("check", "--no-cache", "--select", "AMP0", "src/train.py", cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == b""
    assert a.read_text() == b.read_text() == FIXED and _journals(tmp_path) == []


def test_a_journal_that_does_not_match_the_file_is_left_and_said(tmp_path):
    """The user edited the file after the interrupted run: nothing is restored over the edit,
    and the file is not rewritten while the journal is there."""
    a, b = _linked(tmp_path)
    _killed_rewrite(tmp_path, "between", "src/train.py")
    a.write_text(BAD.replace("lr=0.1", "lr=0.2"))
    res = run_ampfix("rewrite", "--unsafe-fixes", "--no-cache", "src/train.py", cwd=tmp_path)
    err = res.stderr.decode()
    assert "src/train.py: warning: " in err and "is the journal of an interrupted rewrite, but the file was changed " \
                                                 "since; nothing was restored" in err
    assert "src/train.py: error: " in err and "nothing was written" in err and res.returncode == 2
    assert a.read_text() == BAD.replace("lr=0.1", "lr=0.2") and _journals(tmp_path) == [".train.py.ampfix.journal"]


# ----------------------------------------------------------------------------- faults, in process


def _rewrite_in_process(*paths):
    plan = runner.make_plan(runner.Options(paths=[str(p) for p in paths], fix=True, unsafe_fixes=True, jobs=1,
                                           no_cache=True))
    run = runner.run(plan)
    return run, runner.write_fixes(run)


@pytest.mark.parametrize("linked, fault", [
    (linked, fault) for linked in (True, False)
    for fault in ("ENOSPC on write", "write makes no progress", "ENOSPC on truncate", "EIO on fsync")
    if linked or fault != "ENOSPC on truncate"  # a renamed file is never truncated
])
def test_a_failing_write_leaves_the_file_as_it_was(tmp_path, monkeypatch, linked, fault):
    a = tmp_path / "train.py"
    a.write_text(BAD)
    if linked:
        os.link(a, tmp_path / "other.py")
    before = os.stat(a)
    real_write, real_fsync = os.write, os.fsync
    calls = {"n": 0}

    def write(fd, data):
        # the disk is full for the new bytes (the journal's write comes first, in place); the
        # rollback writes the old bytes over blocks the file already has
        calls["n"] += 1
        if calls["n"] == (2 if linked else 1):
            if fault == "ENOSPC on write":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if fault == "write makes no progress":
                return 0
        return real_write(fd, data)

    def ftruncate(fd, n):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fsync(fd):
        if os.fstat(fd).st_size == len(FIXED.encode()) and not calls.get("fsync"):
            calls["fsync"] = 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    if fault == "ENOSPC on truncate":
        monkeypatch.setattr(os, "ftruncate", ftruncate)
    if fault == "EIO on fsync":
        monkeypatch.setattr(os, "fsync", fsync)
    run, errors = _rewrite_in_process(a)
    monkeypatch.undo()
    (err,) = errors
    assert err.startswith(f"{a}: error: cannot write: ") and err.endswith("; nothing was written"), err
    assert a.read_text() == BAD and os.stat(a).st_ino == before.st_ino and os.stat(a).st_nlink == before.st_nlink
    assert _journals(tmp_path) == [] and _temps(tmp_path) == []
    assert [d.code for d in run.diagnostics] == ["AMP011"]  # reported as check does: not fixed


def test_short_writes_are_continued(tmp_path, monkeypatch):
    a = tmp_path / "train.py"
    a.write_text(BAD)
    os.link(a, tmp_path / "other.py")
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    run, errors = _rewrite_in_process(a)
    monkeypatch.undo()
    assert errors == [] and a.read_text() == (tmp_path / "other.py").read_text() == FIXED


def test_a_failed_rollback_leaves_the_journal_for_the_next_run(tmp_path, monkeypatch):
    a = tmp_path / "train.py"
    a.write_text(BAD)
    os.link(a, tmp_path / "other.py")
    real_write = os.write
    failed = []

    def ftruncate(fd, n):  # the disk goes bad at the truncate: nothing can be written after it
        failed.append(fd)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def write(fd, data):
        if failed:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_write(fd, data)

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    monkeypatch.setattr(os, "write", write)
    run, errors = _rewrite_in_process(a)
    monkeypatch.undo()
    (err,) = errors
    assert "cannot write: Input/output error, and the file could not be put back either: the next ampfix run " \
           "restores it from" in err
    assert _journals(tmp_path) == [".train.py.ampfix.journal"]
    res = run_ampfix("check", "--no-cache", "train.py", cwd=tmp_path)
    assert "train.py: warning: restored as it was before an interrupted rewrite" in res.stderr.decode()
    assert a.read_text() == BAD and _journals(tmp_path) == []


def test_a_signal_during_the_in_place_write_waits_for_it(tmp_path, monkeypatch):
    """SIGTERM arriving between the write and the truncate takes effect once the file is
    complete: the journal is gone and the file is whole."""
    a = tmp_path / "train.py"
    a.write_text(BAD)
    os.link(a, tmp_path / "other.py")
    real = os.ftruncate

    def ftruncate(fd, n):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(fd, n)

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    plan = runner.make_plan(runner.Options(paths=[str(a)], fix=True, unsafe_fixes=True, jobs=1, no_cache=True))
    run = runner.run(plan)
    with pytest.raises(signals.Terminated) as exc:
        with signals.terminable():
            runner.write_fixes(run)
    assert exc.value.signum == signal.SIGTERM
    assert a.read_text() == FIXED and _journals(tmp_path) == []


# ----------------------------------------------------------------------------- one file, two names


@pytest.mark.parametrize("kind", ["hard link", "symlink", "symlink first"])
def test_one_file_under_two_names_is_written_once(tmp_path, kind):
    a = tmp_path / "train.py"
    a.write_text(CLIP)
    b = tmp_path / "alias.py"
    if kind == "hard link":
        os.link(a, b)
    else:
        b.symlink_to("train.py")
    names = ["alias.py", "train.py"] if kind == "symlink first" else ["train.py", "alias.py"]
    res = run_ampfix("rewrite", "--preview", *names, cwd=tmp_path)  # AMP003 is a preview rule
    out, err = res.stdout.decode(), res.stderr.decode()
    assert res.returncode == 0, err
    assert err == "" and "changed on disk" not in out
    assert "Fixed 1 finding in 1 file:" in out and "Found 1 finding (1 fixed, 0 remaining)." in out
    assert a.read_text().count("scaler.unscale_(optimizer)") == 1 and b.read_text() == a.read_text()
    assert b.is_symlink() == (kind != "hard link")
    assert run_ampfix("check", "--preview", *names, cwd=tmp_path).returncode == 0
