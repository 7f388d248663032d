"""Files written in place in a results folder never follow a planted link (issue 46, item 4), and a
full disk under a job's log is one line, not a traceback per line (item 5)."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from fnlcore.app import results_lock
from fnlcore.errors import StorageError
from fnlcore.logs import LOG, job_log

SECRET = "a colleague's file\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def _plant(link, target):
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)


def test_a_link_planted_at_a_runs_lock_is_refused(tmp_path, victim):
    ckpt = tmp_path / "results" / "runs" / "r" / "checkpoint.pt"
    _plant(results_lock.run_lock_path(ckpt), victim)
    with pytest.raises(StorageError, match=r"checkpoint\.pt\.lock is a symbolic link .*rm "):
        results_lock.lock_run(ckpt)
    assert victim.read_text() == SECRET


def test_a_link_planted_at_the_workflows_lock_is_refused(tmp_path, victim):
    results = tmp_path / "results"
    _plant(results / results_lock.LOCK_NAME, victim)
    try:
        with pytest.raises(StorageError, match=r"\.fnl-lock is a symbolic link"):
            results_lock.lock_results(results)
    finally:
        results_lock.release_results(results)
    assert victim.read_text() == SECRET


@pytest.mark.parametrize("which", ["log", "journal"])
def test_a_link_planted_at_a_jobs_log_or_journal_is_refused(tmp_path, victim, which):
    log, journal = tmp_path / "logs" / "job.log", tmp_path / "runs" / "checkpoint.pt.journal"
    _plant(log if which == "log" else journal, victim)
    with pytest.raises(StorageError, match="is a symbolic link"):
        with job_log(log, journal=journal, continued=False) as lg:
            lg.info("a line")
    assert victim.read_text() == SECRET


def test_a_hard_link_and_a_fifo_are_refused(tmp_path, victim):
    ckpt = tmp_path / "runs" / "checkpoint.pt"
    ckpt.parent.mkdir()
    os.link(victim, results_lock.run_lock_path(ckpt))
    with pytest.raises(StorageError, match="2 hard links"):
        results_lock.lock_run(ckpt)
    assert victim.read_text() == SECRET
    log = tmp_path / "job.log"
    os.mkfifo(log)  # opening a FIFO for writing would wait for a reader: refused at once instead
    with pytest.raises(StorageError, match="not a regular file"):
        with job_log(log):
            pass


def test_regular_files_are_written_as_before(tmp_path):
    from fnlcore.safe_files import open_regular

    path = tmp_path / "f.txt"
    with open_regular(path, "w") as fh:
        fh.write("one\n")
    with open_regular(path, "a") as fh:
        fh.write("two\n")
    with open_regular(path, "a+") as fh:
        assert fh.read() == "one\ntwo\n"  # reads from the start, writes append
        fh.write("three\n")
    with open_regular(path, "ab") as fh:
        fh.write(b"four\n")
    assert path.read_text() == "one\ntwo\nthree\nfour\n"
    with open_regular(path, "w") as fh:  # "w" truncates, once the file is known to be regular
        fh.write("new\n")
    assert path.read_text() == "new\n"
    ckpt = tmp_path / "checkpoint.pt"
    lock = results_lock.lock_run(ckpt)
    assert "pid" in results_lock.run_lock_path(ckpt).read_text()
    lock.release()


def test_a_full_disk_under_a_jobs_log_is_said_once(tmp_path, capfd):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    with job_log(tmp_path / "job.log") as lg:
        (handler,) = [h for h in LOG.handlers if isinstance(h, logging.FileHandler)]
        handler.stream.write = full
        for i in range(40):
            lg.info("round %d", i)
    err = capfd.readouterr().err
    assert "Logging error" not in err
    assert err.count("no space left on the disk holding the log") == 1
    assert str(tmp_path / "job.log") in err
    assert "round 39" in err  # the console still gets the lines
