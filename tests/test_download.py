"""fnlcore.datasets.download against a local HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import socket
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fnlcore.datasets.download import RemoteFile, candidate_urls, fetch, remote_with, verify_file
from fnlcore.errors import ChecksumError, ConfigError, DataError
from tests.support.httpserver import file_server, serve_directory  # noqa: F401  (fixture)

PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes


def _md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _dead_url() -> str:
    """A loopback URL on a port nobody listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def served(file_server):
    (file_server.root / "data.bin").write_bytes(PAYLOAD)
    return file_server


def _remote(server, md5: str | None = _md5(PAYLOAD), **kw) -> RemoteFile:
    return RemoteFile("data.bin", (server.url_for("data.bin"),), md5=md5, **kw)


# ---- verify_file / RemoteFile -------------------------------------------------------------


def test_verify_file_accepts_matching_and_returns_digests(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(PAYLOAD)
    got = verify_file(p, md5=_md5(PAYLOAD), sha256=_sha256(PAYLOAD), size=len(PAYLOAD))
    assert got == {"md5": _md5(PAYLOAD), "sha256": _sha256(PAYLOAD)}
    assert verify_file(p) == {}  # existence only


def test_verify_file_rejects_wrong_digest_size_and_missing(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(PAYLOAD)
    with pytest.raises(ChecksumError, match=_md5(PAYLOAD)):
        verify_file(p, md5="0" * 32)
    with pytest.raises(ChecksumError, match="sha256"):
        verify_file(p, sha256="f" * 64)
    with pytest.raises(ChecksumError, match=f"expected {len(PAYLOAD) + 1} bytes"):
        verify_file(p, size=len(PAYLOAD) + 1)
    with pytest.raises(DataError, match="not found"):
        verify_file(tmp_path / "missing", md5=_md5(PAYLOAD))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"filename": "a/b.bin"},
        {"filename": ""},
        {"md5": "xyz"},
        {"md5": "0" * 31},
        {"sha256": "0" * 32},
        {"size": -1},
    ],
)
def test_remote_file_rejects_bad_fields(kwargs):
    base = {"filename": "f.bin", "urls": ("http://x/f.bin",)}
    with pytest.raises(ConfigError):
        RemoteFile(**{**base, **kwargs})


def test_remote_file_normalises_and_labels_checksum():
    r = RemoteFile("f.bin", ["http://x/f.bin"], md5="AB" * 16)
    assert r.urls == ("http://x/f.bin",) and r.md5 == "ab" * 16
    assert r.checksum_label() == "md5:" + "ab" * 16
    assert remote_with(r, {"sha256": "cd" * 32}).checksum_label() == "sha256:" + "cd" * 32
    assert RemoteFile("f.bin", ()).checksum_label() == ""


def test_candidate_urls_puts_mirrors_first_and_drops_duplicates(tmp_path):
    r = RemoteFile("f.bin", ("http://official/f.bin", "http://m1/f.bin"))
    urls = candidate_urls(r, ["http://m1/", "http://m2", str(tmp_path)])
    assert urls == ["http://m1/f.bin", "http://m2/f.bin", (tmp_path / "f.bin").as_uri(), "http://official/f.bin"]


# ---- fetch ----------------------------------------------------------------------------------


def test_fetch_downloads_verifies_and_renames(served, tmp_path):
    dest = fetch(_remote(served, sha256=_sha256(PAYLOAD), size=len(PAYLOAD)), tmp_path / "dl")
    assert dest == tmp_path / "dl" / "data.bin"
    assert dest.read_bytes() == PAYLOAD
    assert not (tmp_path / "dl" / "data.bin.part").exists()
    assert [(r.method, r.path, r.range) for r in served.requests] == [("GET", "/data.bin", None)]


def test_fetch_uses_verified_existing_file_without_any_request(served, tmp_path):
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "data.bin").write_bytes(PAYLOAD)
    assert fetch(_remote(served), dl) == dl / "data.bin"
    assert served.requests == []


def test_fetch_replaces_an_existing_file_that_does_not_verify(served, tmp_path):
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "data.bin").write_bytes(b"stale copy")
    fetch(_remote(served), dl)
    assert (dl / "data.bin").read_bytes() == PAYLOAD
    assert len(served.requests) == 1


def test_checksum_mismatch_raises_and_leaves_no_file(served, tmp_path):
    dl = tmp_path / "dl"
    wrong = "0" * 32
    with pytest.raises(ChecksumError) as info:
        fetch(_remote(served, md5=wrong), dl)
    msg = str(info.value)
    assert "data.bin" in msg and served.url_for("data.bin") in msg
    assert wrong in msg and _md5(PAYLOAD) in msg  # expected and actual
    assert "mirror" in msg and str(dl / "data.bin") in msg  # the fix
    assert not (dl / "data.bin").exists() and not (dl / "data.bin.part").exists()


def test_corrupted_server_copy_raises_checksum_error(served, tmp_path):
    corrupted = bytearray(PAYLOAD)
    corrupted[100] ^= 0xFF
    (served.root / "data.bin").write_bytes(bytes(corrupted))
    with pytest.raises(ChecksumError):
        fetch(_remote(served), tmp_path / "dl")
    assert list((tmp_path / "dl").iterdir()) == []


def test_truncated_transfer_keeps_part_then_resumes_with_range(served, tmp_path):
    dl = tmp_path / "dl"
    served.truncate["data.bin"] = 3000
    with pytest.raises(DataError) as info:
        fetch(_remote(served), dl)
    assert not isinstance(info.value, ChecksumError)
    assert "truncated" in str(info.value) and "3000" in str(info.value)
    assert not (dl / "data.bin").exists()
    assert (dl / "data.bin.part").read_bytes() == PAYLOAD[:3000]

    served.truncate.clear()
    fetch(_remote(served), dl)
    assert (dl / "data.bin").read_bytes() == PAYLOAD
    assert not (dl / "data.bin.part").exists()
    assert served.requests[-1].range == "bytes=3000-"
    assert [r.range for r in served.requests] == [None, "bytes=3000-"]


def test_truncation_without_checksum_is_still_detected_by_content_length(served, tmp_path):
    served.truncate["data.bin"] = 10
    with pytest.raises(DataError, match="truncated"):
        fetch(_remote(served, md5=None), tmp_path / "dl")
    assert not (tmp_path / "dl" / "data.bin").exists()


def test_server_ignoring_range_restarts_cleanly(served, tmp_path):
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "data.bin.part").write_bytes(PAYLOAD[:5000])
    served.ignore_range = True
    fetch(_remote(served), dl)
    assert (dl / "data.bin").read_bytes() == PAYLOAD  # not the old prefix + whole file
    assert served.requests[0].range == "bytes=5000-"


def test_part_that_is_already_complete_gets_416_and_is_verified(served, tmp_path):
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "data.bin.part").write_bytes(PAYLOAD)
    fetch(_remote(served), dl)  # no size known: asks for the rest, gets 416, verifies
    assert (dl / "data.bin").read_bytes() == PAYLOAD
    assert served.requests[0].range == f"bytes={len(PAYLOAD)}-"


def test_complete_part_with_known_size_needs_no_request(served, tmp_path):
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "data.bin.part").write_bytes(PAYLOAD)
    fetch(_remote(served, size=len(PAYLOAD)), dl)
    assert (dl / "data.bin").read_bytes() == PAYLOAD
    assert served.requests == []


def test_resumed_part_with_wrong_prefix_fails_checksum_and_next_call_recovers(served, tmp_path):
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "data.bin.part").write_bytes(b"\xff" * 100)  # not a prefix of the file
    with pytest.raises(ChecksumError):
        fetch(_remote(served), dl)
    assert not (dl / "data.bin.part").exists()
    fetch(_remote(served), dl)
    assert (dl / "data.bin").read_bytes() == PAYLOAD


def test_mirrors_are_tried_first_and_dead_ones_fall_through(tmp_path):
    official_root, mirror_root = tmp_path / "official", tmp_path / "mirror"
    with serve_directory(official_root) as official, serve_directory(mirror_root) as mirror:
        (official_root / "data.bin").write_bytes(PAYLOAD)
        (mirror_root / "pub").mkdir(parents=True)
        (mirror_root / "pub" / "data.bin").write_bytes(PAYLOAD)
        remote = _remote(official)
        mirrors = [_dead_url(), mirror.url_for("missing/"), mirror.url_for("pub/")]
        fetch(remote, tmp_path / "dl", mirrors=mirrors)
        assert official.requests == []
        assert [r.path for r in mirror.requests] == ["/missing/data.bin", "/pub/data.bin"]
        assert (tmp_path / "dl" / "data.bin").read_bytes() == PAYLOAD


def test_official_url_used_when_every_mirror_fails(served, tmp_path):
    fetch(_remote(served), tmp_path / "dl", mirrors=[_dead_url(), served.url_for("nothing")])
    assert (tmp_path / "dl" / "data.bin").read_bytes() == PAYLOAD
    assert [r.path for r in served.requests] == ["/nothing/data.bin", "/data.bin"]


def test_good_mirror_recovers_from_a_corrupt_one(tmp_path):
    bad_root, good_root = tmp_path / "bad", tmp_path / "good"
    with serve_directory(bad_root) as bad, serve_directory(good_root) as good:
        (bad_root / "data.bin").write_bytes(PAYLOAD[::-1])
        (good_root / "data.bin").write_bytes(PAYLOAD)
        fetch(_remote(good), tmp_path / "dl", mirrors=[bad])
    assert (tmp_path / "dl" / "data.bin").read_bytes() == PAYLOAD


def test_local_folder_mirror(served, tmp_path):
    folder = tmp_path / "by_hand"
    folder.mkdir()
    (folder / "data.bin").write_bytes(PAYLOAD)
    fetch(_remote(served), tmp_path / "dl", mirrors=[str(folder)])
    assert (tmp_path / "dl" / "data.bin").read_bytes() == PAYLOAD
    assert served.requests == []


def test_every_url_failing_lists_them_all(served, tmp_path):
    dead = _dead_url()
    served.fail["data.bin"] = 503
    remote = RemoteFile("data.bin", (served.url_for("data.bin"), dead + "/data.bin"), md5=_md5(PAYLOAD))
    with pytest.raises(DataError) as info:
        fetch(remote, tmp_path / "dl", mirrors=[served.url_for("m")])
    msg = str(info.value)
    assert not isinstance(info.value, ChecksumError)
    for url in (served.url_for("m/data.bin"), served.url_for("data.bin"), dead + "/data.bin"):
        assert url in msg
    assert "HTTP 503" in msg and "HTTP 404" in msg and "refused" in msg.lower()
    assert "mirror" in msg and str(tmp_path / "dl" / "data.bin") in msg and _md5(PAYLOAD) in msg
    assert not (tmp_path / "dl" / "data.bin").exists()


def test_no_url_at_all_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="place it at"):
        fetch(RemoteFile("x.bin", ()), tmp_path)


def test_mirrors_given_as_a_string_is_a_config_error(served, tmp_path):
    with pytest.raises(ConfigError, match="mirrors"):
        fetch(_remote(served), tmp_path, mirrors="http://m")


def test_progress_reports_on_stderr(served, tmp_path, capsys):
    fetch(_remote(served), tmp_path / "dl", progress=True)
    assert "data.bin" in capsys.readouterr().err


def test_head_and_ranges_of_the_test_server(served):
    import urllib.request

    req = urllib.request.Request(served.url_for("data.bin"), method="HEAD")
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 200 and int(resp.headers["Content-Length"]) == len(PAYLOAD)
    req = urllib.request.Request(served.url_for("data.bin"), headers={"Range": "bytes=10-19"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 206 and resp.headers["Content-Range"] == f"bytes 10-19/{len(PAYLOAD)}"
        assert resp.read() == PAYLOAD[10:20]
    assert [(r.method, r.range) for r in served.requests_for("data.bin")] == [("HEAD", None), ("GET", "bytes=10-19")]


@settings(max_examples=20, deadline=None)
@given(
    payload=st.binary(min_size=1, max_size=5000),
    cut_fraction=st.floats(min_value=0.0, max_value=0.99),
    ignore_range=st.booleans(),
)
def test_any_interrupted_download_resumes_to_the_exact_file(payload, cut_fraction, ignore_range):
    cut = int(len(payload) * cut_fraction)
    with tempfile.TemporaryDirectory() as tmp:
        root, dl = Path(tmp) / "srv", Path(tmp) / "dl"
        root.mkdir()
        (root / "f.bin").write_bytes(payload)
        with serve_directory(root, truncate={"f.bin": cut}) as url:
            remote = RemoteFile("f.bin", (url.url_for("f.bin"),), md5=_md5(payload))
            with pytest.raises(DataError):
                fetch(remote, dl)
            assert (dl / "f.bin.part").stat().st_size == cut
            url.truncate.clear()
            url.ignore_range = ignore_range
            assert fetch(remote, dl).read_bytes() == payload
            assert not (dl / "f.bin.part").exists()
