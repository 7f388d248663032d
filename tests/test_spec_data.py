"""The spec-data fallback (tests/spec_data.py): fixtures rebuilt from the published files.

A local HTTP server on 127.0.0.1 stands in for GitHub, and every official URL is pointed at a
closed port, so nothing here reaches the network. The server holds the FedNoRo CSVs (byte
copies of the shared fixtures, made at test time) and FedMLP ``.npy`` files in the upstream
layout (``np.save`` of a dict client -> row indices). Their collections are lists: a set built
from a fixture's order iterates in another order (it is not the set upstream pickled), while
``read_client_index_npy`` keeps a list's order exactly, which the pinned content hash needs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fnlcore.datasets import official_files as of
from fnlcore.errors import ChecksumError, DataError
from tests import spec_data as sd
from tests.support.httpserver import file_server  # noqa: F401  (fixture)

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused at once


@pytest.fixture(autouse=True)
def offline_official_urls(monkeypatch):
    """Only the mirror a test passes can deliver: the pinned GitHub URLs point at a closed port."""
    for key, entry in of.OFFICIAL_FILES.items():
        remote = replace(entry.remote, urls=(f"{CLOSED}/{entry.remote.filename}",))
        monkeypatch.setitem(of.OFFICIAL_FILES, key, replace(entry, remote=remote))


def _served_name(fixture: str) -> str:
    return of.official_file(sd.FIXTURES[fixture]).remote.filename


def _clients(csv: Path) -> dict[int, list[int]]:
    df = pd.read_csv(csv).sort_values(["client_id", "position_in_client_list"])
    return {int(k): g["train_csv_row_index"].tolist() for k, g in df.groupby("client_id")}


@pytest.fixture
def mirror(file_server, spec_data_dir):  # noqa: F811
    """The four published files, made from the shared fixtures."""
    for name in sd.FIXTURES:
        target = file_server.root / _served_name(name)
        if target.suffix == ".npy":
            # FedMLP publishes a pickled dict (np.save of an object); fnlcore reads it back only
            # through its restricted unpickler (official_files.read_client_index_npy)
            np.save(target, _clients(spec_data_dir / name), allow_pickle=True)
        else:
            target.write_bytes((spec_data_dir / name).read_bytes())
    return file_server


def test_fixtures_are_rebuilt_from_a_mirror_once(mirror, spec_data_dir, tmp_path, capsys):
    dest = tmp_path / "cache"
    assert sd.main(["--dest", str(dest), "--mirror", mirror.url, "--timeout", "5"]) == 0
    assert capsys.readouterr().out.split() == [str(dest / name) for name in sd.FIXTURES]
    for name in sd.FIXTURES:  # the shared copies have CRLF line ends, the FedMLP exports LF
        norm = (spec_data_dir / name).read_bytes().replace(b"\r\n", b"\n")
        assert (dest / name).read_bytes().replace(b"\r\n", b"\n") == norm, name
    assert sorted(r.name for r in mirror.requests) == sorted(_served_name(n) for n in sd.FIXTURES)
    assert not list(dest.glob(".*.tmp"))
    before = len(mirror.requests)
    assert sd.fetch_spec_data(dest, mirrors=[mirror.url], timeout=5) == dest
    assert len(mirror.requests) == before  # a second call downloads nothing


@pytest.mark.parametrize("name", ["fednoro_train_ICH.csv", "fedmlp_ICH_client_indices.csv"])
def test_a_corrupted_file_raises_checksum_error_and_leaves_no_fixture(
    file_server, tmp_path, monkeypatch, name  # noqa: F811
):
    monkeypatch.setattr(sd, "FIXTURES", {name: sd.FIXTURES[name]})
    served = file_server.root / _served_name(name)
    if served.suffix == ".npy":  # the upstream layout (sets), other content: the content hash fails
        np.save(served, {0: {3, 1, 2}}, allow_pickle=True)
    else:  # the published size (a shorter file is resumed, not rejected), other bytes: the sha256 fails
        served.write_bytes(b"0" * of.official_file(sd.FIXTURES[name]).remote.size)
    dest = tmp_path / "cache"
    with pytest.raises(ChecksumError):
        sd.fetch_spec_data(dest, mirrors=[file_server.url], timeout=5)
    assert sd.missing(dest) == [name]
    assert not list(dest.glob(".*.tmp"))


def test_an_unreachable_mirror_raises_the_data_error_the_fixture_skips_on(tmp_path):
    dest = tmp_path / "cache"
    with pytest.raises(DataError) as info:
        sd.fetch_spec_data(dest, mirrors=[CLOSED], timeout=5)
    assert not isinstance(info.value, ChecksumError)  # conftest: ChecksumError fails, DataError skips
    assert sd.missing(dest) == list(sd.FIXTURES)
    assert sd.main(["--dest", str(dest), "--mirror", CLOSED, "--timeout", "5"]) == 1
    reason = sd.offline_reason(tmp_path / "shared" / "spec" / "data", dest)
    assert "\n" not in reason and all(name in reason for name in sd.FIXTURES)
    assert "FNL_SHARED_DIR" in reason and "python -m tests.spec_data" in reason


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(sd.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sd._write_atomic(tmp_path / "fednoro_train_ICH.csv", b"id\n")
    assert list(tmp_path.iterdir()) == []


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FNL_TEST_CACHE", str(tmp_path / "explicit"))
    assert sd.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("FNL_TEST_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert sd.cache_dir() == tmp_path / "xdg" / "fnl-repro" / "spec-data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sd.cache_dir() == tmp_path / "home" / ".cache" / "fnl-repro" / "spec-data"
