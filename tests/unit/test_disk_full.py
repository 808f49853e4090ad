"""A full disk, told apart from other failures (pipeline/errors.py `out_of_space`) and said in
one line (`no_space_line`, exit code 74), wherever the project writes: files.atomic_write
leaves nothing half-written and names the file, whatever the writer raised. The real thing
(a full tmpfs) is tests/e2e/test_full_disk.py."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import errors
from pipeline.errors import disk_full, no_space_line, out_of_space
from pipeline.files import atomic_write, staged


class CheckpointException(BaseException):
    """torch.distributed.checkpoint's, in its shape: per-rank (exception, traceback) pairs,
    and not an Exception."""

    def __init__(self, failures: dict):
        super().__init__("CheckpointException", failures)
        self.failures = failures


ENOSPC = OSError(errno.ENOSPC, "No space left on device", "checkpoints/x/.rank0.pt.tmp")


@pytest.mark.parametrize(
    ("err", "found"),
    [
        (ENOSPC, Path("checkpoints/x/rank0.pt")),  # atomic_write's temporary: its file
        (OSError(errno.EDQUOT, "Disk quota exceeded", "a/b"), Path("a/b")),
        (OSError(errno.ENOSPC, "No space left on device", "x/cache.tmp"), Path("x/cache.tmp")),
        (OSError(errno.ENOSPC, "No space left on device"), Path("where")),  # no file named
        (CheckpointException({0: (ENOSPC, None)}), Path("checkpoints/x/rank0.pt")),
        (RuntimeError("database or disk is full"), Path("where")),  # SQLite's SQLITE_FULL
        (OSError(errno.EACCES, "Permission denied", "a"), None),
        (RuntimeError("unexpected pos 704 vs 598"), None),  # on a disk with room
    ],
)
def test_a_full_disk_is_found_anywhere_in_the_chain(err, found):
    assert out_of_space(err, Path("where")) == found
    wrapped = RuntimeError("while saving")
    wrapped.__cause__ = err
    assert out_of_space(wrapped, Path("where")) == found


def test_a_failure_on_an_all_but_full_filesystem_is_a_full_disk(monkeypatch, tmp_path):
    """torch.save reports a full disk as a RuntimeError of its own: the filesystem says. An
    exit or an interrupt stays what it is."""
    err = RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 704 vs 598")
    assert out_of_space(err, tmp_path / "not-yet" / "made") is None
    monkeypatch.setattr(errors, "NEARLY_FULL_BYTES", 2**62)
    assert out_of_space(err, tmp_path / "not-yet" / "made") == tmp_path / "not-yet" / "made"
    assert out_of_space(KeyboardInterrupt(), tmp_path) is None
    assert out_of_space(SystemExit(75), tmp_path) is None


def test_atomic_write_leaves_nothing_half_written_and_names_its_file(monkeypatch, tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("the old one")

    def full(path: Path) -> None:
        path.write_text("half")
        raise RuntimeError("unexpected pos 704 vs 598")

    monkeypatch.setattr(errors, "NEARLY_FULL_BYTES", 2**62)  # this filesystem: "full"
    with pytest.raises(OSError) as raised:
        atomic_write(target, full)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    assert target.read_text() == "the old one"
    monkeypatch.setattr(errors, "NEARLY_FULL_BYTES", 0)  # any other failure stays itself
    with pytest.raises(RuntimeError):
        atomic_write(target, full)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_the_line_names_the_path_the_words_and_the_fix():
    line = no_space_line(Path("results/ddp/model.pt"), "run the stage again")
    assert line == (
        "no space left on device writing results/ddp/model.pt: free some space there "
        "(df -h results/ddp), then run the stage again; what was saved before is kept"
    )
    assert line.startswith(errors.NO_SPACE)


def test_a_commands_full_disk_is_one_line_and_exit_74(tmp_path):
    """Every command's entry point (exit_on_user_error) answers it so."""
    code = (
        "from pathlib import Path\n"
        "from pipeline.errors import disk_full, exit_on_user_error\n"
        "@exit_on_user_error\n"
        "def main():\n"
        "    raise disk_full(Path('reports/index.html'))\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == errors.DISK_FULL_EXIT == 74
    assert proc.stderr.splitlines() == ["error: " + no_space_line(Path("reports/index.html"))]
    assert disk_full(Path("x")).errno == errno.ENOSPC


def test_publish_says_what_to_do_with_a_store_whose_making_ran_out_of_space(monkeypatch):
    """A SQLite store whose schema migration a full disk cut short is left half-made by
    MLflow, which then refuses it at every try ("table _alembic_tmp_experiments already
    exists": produced by hand on a 600 KiB tmpfs). publish says so, and what to do, instead
    of "run again later". (The failure is the store's; publish_strategy raises it here.)"""
    from pipeline import publish
    from pipeline.tracking import kept_runs

    def half_made(name, model_of=None):
        raise RuntimeError(
            "(sqlite3.OperationalError) table _alembic_tmp_experiments already exists"
        )

    monkeypatch.setattr(kept_runs, "publish_strategy", half_made)
    with pytest.raises(errors.UserError, match="is half-made .* move it aside"):
        publish.publish_all(["single"], None)


def write_set(directory: Path, fail_at: str | None = None, error: BaseException | None = None):
    """A report-like set of three files, failing as it writes `fail_at`."""
    with staged(directory) as out:
        for name in ("a.json", "b.png", "index.html"):

            def write(tmp: Path, name: str = name) -> None:
                if name == fail_at:
                    raise error
                tmp.write_text(f"new {name}")

            atomic_write(out / name, write)


def test_a_staged_set_moves_in_whole_and_leaves_no_staging_folder(tmp_path):
    (tmp_path / "a.json").write_text("old a.json")
    write_set(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.png", "index.html"]
    assert (tmp_path / "a.json").read_text() == "new a.json"


@pytest.mark.parametrize("error", [ENOSPC, RuntimeError("a plot failed")])
def test_a_set_that_fails_on_the_way_leaves_the_last_one_as_it_was(tmp_path, error):
    old = {name: f"old {name}" for name in ("a.json", "b.png", "index.html")}
    for name, text in old.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(type(error)) as raised:
        write_set(tmp_path, "index.html", error)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == old
    if error is ENOSPC:  # named as the file it would have been, not its staged copy
        assert raised.value.filename == str(tmp_path / "index.html")
