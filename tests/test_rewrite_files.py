"""What `ampfix rewrite` promises about the files it writes (ampfix/engine/fileio.py): the layout of
every line no fix names (line breaks, form feeds, encoding), a re-check and a per-file lock
before replacing, mode, owner, hard links and symlinks kept, read-only files refused, only
fixes that reached the disk counted, temporary files of killed runs removed."""

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from click.testing import CliRunner

from ampfix.frontends import cli

from ampfix.engine import fileio
from conftest import run_ampfix

# AMP003's finding, a preview rule: the runs that fix it turn preview on
BAD_CLIP = textwrap.dedent(
    """\
    import torch


    def step(model, optimizer, scaler, loss):
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    """
)
FIXED_CLIP = BAD_CLIP.replace(
    "    torch.nn.utils.clip_grad_norm_", "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_"
)
# a backward inside autocast: the fix moves two statements out of the `with` block (AMP001)
BAD_MOVE = textwrap.dedent(
    """\
    import torch


    def train(loader, loss_fn, model, optimizer, scaler):
        for x, y in loader:
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
    """
)


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def rewrite(*args):
    res = run_ampfix("rewrite", *args)
    return res.returncode, res.stdout.decode(), res.stderr.decode()


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize("nl", ["\r", "\r\n"], ids=["cr", "crlf"])
def test_line_breaks_kept(tmp_path, nl):
    p = write(tmp_path / "t.py", BAD_CLIP.replace("\n", nl).encode())
    code, out, err = rewrite("--preview", p)
    assert code == 0, out + err
    assert p.read_bytes() == FIXED_CLIP.replace("\n", nl).encode()


def test_mixed_line_breaks_kept_and_new_line_takes_its_neighbours(tmp_path):
    lines = BAD_CLIP.splitlines(keepends=True)
    ends = ["\r\n", "\n", "\r", "\n", "\r\n", "\r", "\n", "\r\n"]
    mixed = "".join(line[:-1] + e for line, e in zip(lines, ends))
    p = write(tmp_path / "t.py", mixed.encode())
    assert rewrite("--preview", p)[0] == 0
    new = p.read_bytes().decode()
    old_lines = fileio.split_lines(mixed)
    new_lines = fileio.split_lines(new)
    assert len(new_lines) == len(old_lines) + 1
    inserted = new_lines.index("    scaler.unscale_(optimizer)\r\n")  # the line break of the line before it
    assert new_lines[:inserted] == old_lines[:inserted] and new_lines[inserted + 1:] == old_lines[inserted:]


def test_cr_file_with_cookie_and_bom(tmp_path):
    latin = ("# -*- coding: latin-1 -*-\n# caf\u00e9\n" + BAD_CLIP).replace("\n", "\r")
    p = write(tmp_path / "latin.py", latin.encode("latin-1"))
    assert rewrite("--preview", p)[0] == 0
    want = ("# -*- coding: latin-1 -*-\n# caf\u00e9\n" + FIXED_CLIP).replace("\n", "\r")
    assert p.read_bytes() == want.encode("latin-1")
    bom = b"\xef\xbb\xbf" + ("# \u00fcber\n" + BAD_CLIP).replace("\n", "\r\n").encode()
    q = write(tmp_path / "bom.py", bom)
    assert rewrite("--preview", q)[0] == 0
    assert q.read_bytes() == b"\xef\xbb\xbf" + ("# \u00fcber\n" + FIXED_CLIP).replace("\n", "\r\n").encode()


def test_form_feed_of_a_moved_line_and_elsewhere_kept(tmp_path):
    src = (BAD_MOVE.replace("            scaler.scale(loss)", "\f            scaler.scale(loss)")
           .replace("def train", "\fdef train")
           + 'DOC = """\n\f  text\n"""\nx = 1  \f# odd but legal\n')
    compile(src, "t.py", "exec")
    p = write(tmp_path / "t.py", src.encode())
    assert rewrite(p)[0] == 0
    new = p.read_text()
    assert "\f        scaler.scale(loss).backward()\n" in new  # moved one level out, form feed kept
    assert "\fdef train" in new and '"""\n\f  text\n"""' in new and "x = 1  \f# odd but legal\n" in new
    compile(new, "t.py", "exec")


def test_restore_layout_never_changes_the_program():
    """The mapping is checked: when it could change the program, LibCST's text is kept."""
    original = "x = 1\r\ny = '''\r\n\fa\r\n'''\r\n"
    work = fileio.working_text(original)
    fixed = work.replace("x = 1", "x = 2")
    out = fileio.restore_layout(original, fixed)
    assert out == original.replace("x = 1", "x = 2")
    assert fileio.restore_layout("a = 1\r", "a = 1\nb = 2\n") == "a = 1\rb = 2\r"


# ----------------------------------------------------------------------------- re-check and lock


def _invoke(args):
    return CliRunner().invoke(cli.main, ["rewrite", *map(str, args)])


def test_file_changed_between_read_and_write_is_not_overwritten(tmp_path, monkeypatch):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    other = write(tmp_path / "u.py", BAD_CLIP.encode())
    users_edit = BAD_CLIP + "# the user's edit\n"

    def edit(path):
        if path.endswith("t.py"):
            with open(path, "a", encoding="utf-8") as fh:  # a real write to the file, as an editor does
                fh.write("# the user's edit\n")

    monkeypatch.setattr(fileio, "_before_recheck", edit)
    res = _invoke(["--preview", p, other])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if "error" in line]
    assert errors == [f"{p}: error: {fileio.CHANGED}"]
    assert p.read_text() == users_edit  # the user's edit survives; no fix written over it
    assert other.read_text() == FIXED_CLIP  # the other file is still fixed
    assert "Fixed 1 finding in 1 file" in res.output


def test_same_size_same_mtime_edit_is_caught_by_the_hash(tmp_path):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    data, snap = fileio.read_file(str(p))
    st = p.stat()
    p.write_bytes(data.replace(b"loss", b"LOSS"))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(fileio.WriteRefused):
        fileio.write_fixed(str(p), FIXED_CLIP.encode(), snap)
    assert b"LOSS" in p.read_bytes()


def test_write_waits_for_the_lock_then_sees_the_change(tmp_path):
    """A second writer blocks on the file's lock while the first holds it, and then finds
    the file changed (the first one replaced it) instead of writing over it."""
    import fcntl

    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    data, snap = fileio.read_file(str(p))
    fd = os.open(p, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    outcome = []

    def second():
        try:
            fileio.write_fixed(str(p), b"# second\n", snap)
            outcome.append("written")
        except fileio.WriteRefused as exc:
            outcome.append(str(exc))

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.3)
    assert not outcome  # still waiting for the lock
    # "the first run", holding the lock, replaces the file as write_fixed does
    tmp = tmp_path / ".t.py.first000.ampfix.tmp"
    tmp.write_text(FIXED_CLIP)
    os.replace(tmp, p)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    t.join(10)
    assert outcome == [fileio.CHANGED]
    assert p.read_text() == FIXED_CLIP


CONCURRENT = BAD_CLIP + textwrap.dedent(
    """\


    def step2(model, optimizer, scaler, loss):
        scaler.scale(loss).backward()
        optimizer.step()
    """
)


def test_two_concurrent_rewrites_lose_no_fix(tmp_path):
    """Two `ampfix rewrite` processes on one file, fixing different rules: whatever the
    interleaving, a fix a run reports as written is in the file, and a run that lost the
    race says so (exit 2) instead of writing over the other's fix."""
    for attempt in range(2):
        p = write(tmp_path / f"t{attempt}.py", CONCURRENT.encode())
        cmd = [sys.executable, "-m", "ampfix", "rewrite", "--preview", "--unsafe-fixes", str(p)]
        env = {**os.environ, "NO_COLOR": "1"}
        procs = [subprocess.Popen(cmd + ["--select", sel], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
                 for sel in ("AMP003", "AMP007")]
        results = [(proc.wait(120), proc.stdout.read().decode(), proc.stderr.read().decode()) for proc in procs]
        final = p.read_text()
        compile(final, str(p), "exec")
        for (code, out, err), marker in zip(results, ("scaler.unscale_(optimizer)", "scaler.step(optimizer)\n"
                                                                                    "    scaler.update()\n\n")):
            if code == 2:
                assert fileio.CHANGED in err and "Traceback" not in err
            else:
                assert "Fixed 1 finding" in out, out + err
                assert marker.split("\n")[0] in final
        assert final.count("scaler.unscale_(optimizer)") <= 1


# ----------------------------------------------------------------------------- what is replaced


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_mode_and_owner_kept(tmp_path):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    os.chown(p, 4321, 4322)
    os.chmod(p, 0o640)
    assert rewrite("--preview", p)[0] == 0
    st = p.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4321, 4322, 0o640)
    assert p.read_text() == FIXED_CLIP


def test_hard_links_written_through(tmp_path):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    twin = tmp_path / "twin.py"
    os.link(p, twin)
    ino = p.stat().st_ino
    code, out, err = rewrite("--preview", p)
    assert code == 0, out + err
    assert p.stat().st_ino == ino and p.stat().st_nlink == 2
    assert twin.read_text() == FIXED_CLIP == p.read_text()


def test_symlink_kept_and_target_written(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    target = write(real / "t.py", BAD_CLIP.encode())
    link = tmp_path / "link.py"
    link.symlink_to(target)
    code, out, err = rewrite("--preview", link)
    assert code == 0, out + err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == FIXED_CLIP
    assert not fileio.temp_files_of(str(tmp_path)) and not fileio.temp_files_of(str(real))


def test_read_only_file_refused(tmp_path):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    q = write(tmp_path / "u.py", BAD_CLIP.encode())
    os.chmod(p, 0o444)
    code, out, err = rewrite("--preview", p, q)
    assert code == 2
    assert err.strip().splitlines() == [f"{p}: error: the file is read-only (no write permission); nothing was "
                                        "written (make it writable to rewrite it)"]
    assert p.read_text() == BAD_CLIP and stat.S_IMODE(p.stat().st_mode) == 0o444
    assert q.read_text() == FIXED_CLIP
    # only the fix that reached the disk is counted; the refused file's finding is still reported
    assert "Fixed 1 finding in 1 file" in out
    assert f"{p}:6:5: AMP003" in out
    assert "Found 2 findings (1 fixed, 1 remaining)." in out


def test_failed_write_counts_no_fix(tmp_path):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    os.chmod(p, 0o444)
    code, out, err = rewrite("--preview", p)
    assert code == 2 and "Fixed" not in out and "Nothing to fix." in out


def test_stale_temp_files_removed_on_next_run(tmp_path):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    q = write(tmp_path / "clean.py", b"import torch\n")
    stale = [tmp_path / ".t.py.ab12cd34.ampfix.tmp", tmp_path / ".clean.py.zz99yy88.ampfix.tmp"]
    for s in stale:
        s.write_bytes(b"half written")
    not_ours = [tmp_path / ".gone.py.ab12cd34.ampfix.tmp", tmp_path / "notes.tmp"]
    for s in not_ours:
        s.write_bytes(b"x")
    assert rewrite("--preview", p, q)[0] == 0
    assert not any(s.exists() for s in stale)
    assert all(s.exists() for s in not_ours)  # not tied to a file ampfix can see: left alone
    assert p.read_text() == FIXED_CLIP


def test_killed_rewrite_leaves_a_file_the_next_run_removes(tmp_path):
    """`kill -9` between creating the temporary file and the rename (simulated: the process
    dies in os.replace); the file is intact and the next run removes the leftover."""
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    script = ("import os, sys\nfrom ampfix.frontends import cli\nos.replace = lambda *a: os.kill(os.getpid(), 9)\n"
              f"sys.argv = ['ampfix', 'rewrite', '--preview', {str(p)!r}]\ncli.main()\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert res.returncode == -9
    assert p.read_text() == BAD_CLIP
    left = fileio.temp_files_of(str(tmp_path), "t.py")
    assert len(left) == 1
    assert rewrite("--preview", p)[0] == 0
    assert not fileio.temp_files_of(str(tmp_path)) and p.read_text() == FIXED_CLIP


# ----------------------------------------------------------------------------- summary


def test_summary_counts_findings_not_import_edits(tmp_path):
    src = textwrap.dedent(
        """\
        import torch
        from torch.cuda.amp import autocast, GradScaler

        scaler = GradScaler()
        with autocast():
            y = torch.ones(2)
        """
    )
    p = write(tmp_path / "t.py", src.encode())
    res = run_ampfix("check", p)
    assert res.stdout.decode().count("AMP101") == 2
    code, out, err = rewrite(p)
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "Fixed 2 findings in 1 file:"
    assert lines[1] == "     2  AMP101  deprecated-amp-api  (+1 follow-up edit)"
    assert "             1  imports of torch.cuda.amp / torch.cpu.amp -> torch.amp" in lines
    assert lines[-1] == "Found 2 findings (2 fixed, 0 remaining)."


def test_blank_lines_libcst_drops_by_itself_are_kept(tmp_path):
    """Found by the property test: LibCST does not give back blank lines before a
    whitespace-only last line; a rewrite elsewhere in the file must not lose them."""
    src = BAD_MOVE + "\n\n \n"
    p = write(tmp_path / "t.py", src.encode())
    assert rewrite(p)[0] == 0
    new = p.read_text()
    assert new.endswith("        scaler.update()\n\n\n \n") and "scaler.scale(loss).backward()" in new
    # a statement the fix appends at the end of the function goes before them
    original = "def f():\n    step()\n\n\n \n"
    libcst_fixed = "def f():\n    step()\n    update()\n \n"  # what LibCST renders after the fix
    assert fileio.restore_layout(original, libcst_fixed) == "def f():\n    step()\n    update()\n\n\n \n"
    # two whitespace-only lines at the end: LibCST gives one back
    original = "def f():\n    step()\ng\n \n \n"
    assert fileio.restore_layout(original, "def f():\n    update()\ng\n \n") == "def f():\n    update()\ng\n \n \n"


def test_file_deleted_before_the_write_is_not_recreated(tmp_path, monkeypatch):
    p = write(tmp_path / "t.py", BAD_CLIP.encode())
    monkeypatch.setattr(fileio, "_before_recheck", None)
    from ampfix.engine import runner

    plan = runner.make_plan(runner.Options(paths=[str(p)], fix=True, preview=True))
    result = runner.run(plan)
    p.unlink()
    assert runner.write_fixes(result) == [f"{p}: error: {fileio.CHANGED}"]
    assert not p.exists() and not fileio.temp_files_of(str(tmp_path))
    assert result.results[0].fixed == {} and result.results[0].new_source is None
