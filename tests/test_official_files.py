"""Official label/index files (pinned, checked, loaded) and the shared raw-file checks.

The FedNoRo CSVs are the real published files (spec fixtures) served by a
local HTTP server, so the pinned sha256 values are checked for real. The
FedMLP index files are rebuilt as .npy from the fixture CSVs and read back.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fnlcore.assignment import ClientAssignment
from fnlcore.datasets import official_files as of
from fnlcore.datasets.download import verify_file
from fnlcore.errors import ChecksumError, ConfigError, DataError, MissingManualDataError
from tests.support.httpserver import file_server, serve_directory  # noqa: F401  (fixture)

FEDNORO_FIXTURES = {"fednoro_ich_train": "fednoro_train_ICH.csv", "fednoro_ich_test": "fednoro_test_ICH.csv"}
FEDMLP_FIXTURES = {
    "fedmlp_ich_clients": "fedmlp_ICH_client_indices.csv",
    "fedmlp_chestxray14_clients": "fedmlp_ChestXray14_client_indices.csv",
}


def clients_from_fixture(path: Path) -> list[np.ndarray]:
    df = pd.read_csv(path).sort_values(["client_id", "position_in_client_list"])
    return [g["train_csv_row_index"].to_numpy(np.int64) for _, g in df.groupby("client_id")]


def save_dict_npy(path: Path, obj: dict) -> Path:
    np.save(path, obj, allow_pickle=True)
    return path


# ---- the table -----------------------------------------------------------------------------


def test_every_official_file_is_pinned_to_a_full_commit_with_a_check():
    for key, entry in of.OFFICIAL_FILES.items():
        assert entry.key == key
        (url,) = entry.remote.urls
        assert url == f"https://raw.githubusercontent.com/{entry.repo}/{entry.commit}/{entry.path}"
        assert len(entry.commit) == 40 and all(c in "0123456789abcdef" for c in entry.commit)
        assert entry.remote.filename == entry.path.rsplit("/", 1)[-1]
        # a byte checksum, or a content check that fetch_official runs
        assert entry.remote.sha256 or entry.content_sha256 or entry.git_blob
    # ICH_softlabel.csv as listed in the pinned commit's tree
    assert of.official_file("fednoro_ich_softlabel").git_blob == "6b79847e85f414b2e223e816b3f321feae060f1e"


def test_git_blob_id_matches_git_and_pins_the_published_csv(spec_data_dir, tmp_path):
    # the FedNoRo tree at the pin lists data/train_ICH.csv with this blob id
    assert of.git_blob_sha1(spec_data_dir / "fednoro_train_ICH.csv") == "d5919ff33e776f38ce87a9185a85f7d30edf9929"
    f = tmp_path / "hello.txt"
    f.write_bytes(b"hello\n")
    assert of.git_blob_sha1(f) == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object
    of.check_git_blob(f, "ce013625030ba8dba906f756967f9e9ca394464a", "test")
    with pytest.raises(ChecksumError, match="git blob id"):
        of.check_git_blob(f, "0" * 40, "test")


def test_unknown_official_key_is_a_config_error_listing_keys():
    with pytest.raises(ConfigError, match="fednoro_ich_train"):
        of.official_file("fednoro_ich_trian")


@pytest.mark.parametrize("key", sorted(FEDNORO_FIXTURES))
def test_pinned_fednoro_checksums_match_the_published_files(spec_data_dir, key):
    entry = of.official_file(key)
    verify_file(spec_data_dir / FEDNORO_FIXTURES[key], sha256=entry.remote.sha256, size=entry.remote.size)


def test_fednoro_csvs_download_through_a_mirror_and_verify(spec_data_dir, file_server, tmp_path):
    for key, fixture in FEDNORO_FIXTURES.items():
        (file_server.root / of.official_file(key).remote.filename).write_bytes((spec_data_dir / fixture).read_bytes())
    dest = tmp_path / "raw"
    for key in FEDNORO_FIXTURES:
        path = of.fetch_official(key, dest, mirrors=[file_server.url])
        assert path == dest / of.official_file(key).remote.filename
    assert sorted(p.name for p in dest.iterdir()) == ["test_ICH.csv", "train_ICH.csv"]
    # present and verified: a second call makes no request
    n = len(file_server.requests)
    of.fetch_official("fednoro_ich_train", dest, mirrors=[file_server.url])
    assert len(file_server.requests) == n


def test_a_changed_fednoro_csv_is_a_checksum_error_and_leaves_nothing(spec_data_dir, file_server, tmp_path):
    data = bytearray((spec_data_dir / "fednoro_train_ICH.csv").read_bytes())
    data[100] = ord("0") if data[100] != ord("0") else ord("1")  # same size, other bytes
    (file_server.root / "train_ICH.csv").write_bytes(bytes(data))
    dest = tmp_path / "raw"
    with pytest.raises(ChecksumError) as info:
        of.fetch_official("fednoro_ich_train", dest, mirrors=[file_server.url])
    msg = str(info.value)
    assert "train_ICH.csv" in msg and of.official_file("fednoro_ich_train").remote.sha256 in msg
    assert not (dest / "train_ICH.csv").exists() and not (dest / "train_ICH.csv.part").exists()


# ---- FedNoRo CSV readers -------------------------------------------------------------------


def test_fednoro_ich_csvs_read_verbatim_with_the_spec_class_counts(spec_data_dir):
    train = of.read_fednoro_ich_csv(spec_data_dir / "fednoro_train_ICH.csv", expected_rows=47_578)
    test = of.read_fednoro_ich_csv(spec_data_dir / "fednoro_test_ICH.csv", expected_rows=20_391)
    assert np.bincount(train["label"], minlength=5).tolist() == [1046, 9776, 6198, 10275, 20283]
    assert np.bincount(test["label"], minlength=5).tolist() == [451, 4156, 2716, 4442, 8626]
    # file order kept: first rows are ID_3a0809fec (subdural) and ID_78d909124 (intraventricular)
    assert train["id"].iloc[:2].tolist() == ["ID_3a0809fec", "ID_78d909124"]
    assert train["label"].iloc[:2].tolist() == [4, 2]
    assert train["label"].dtype == np.int64
    assert not set(train["id"]) & set(test["id"])


@pytest.mark.parametrize(
    "text, match",
    [
        ("id,epidural,intraparenchymal,intraventricular,subarachnoid\nID_a,1,0,0,0\n", "header"),
        ("id,epidural,intraparenchymal,intraventricular,subarachnoid,subdural\nID_a,1,0,0,0,1\n", "one-hot"),
        ("id,epidural,intraparenchymal,intraventricular,subarachnoid,subdural\nID_a,0,0,0,0,0\n", "one-hot"),
        (
            "id,epidural,intraparenchymal,intraventricular,subarachnoid,subdural\nID_a,0,0,0,0,1\n",
            "2 data rows|1 data rows",
        ),
    ],
)
def test_bad_fednoro_csvs_are_data_errors_naming_the_file(tmp_path, text, match):
    p = tmp_path / "train_ICH.csv"
    p.write_text(text)
    with pytest.raises(DataError, match=match) as info:
        of.read_fednoro_ich_csv(p, expected_rows=2)
    assert str(p) in str(info.value)


def test_softlabels_are_checked_by_content(tmp_path):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(5), size=7)
    good = tmp_path / "ICH_softlabel.csv"
    pd.DataFrame({"id": [f"ID_{i}" for i in range(7)], **{f"p{j}": probs[:, j] for j in range(5)}}).to_csv(
        good, index=False
    )
    np.testing.assert_allclose(of.read_fednoro_softlabels(good, expected_rows=7), probs)
    with pytest.raises(DataError, match="7 rows, expected 8"):
        of.read_fednoro_softlabels(good, expected_rows=8)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"id": ["a"], **{f"p{j}": [1.5 if j == 0 else 0.0] for j in range(5)}}).to_csv(bad, index=False)
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        of.read_fednoro_softlabels(bad, expected_rows=1)
    narrow = tmp_path / "narrow.csv"
    pd.DataFrame({"id": ["a"], "p": [1.0]}).to_csv(narrow, index=False)
    with pytest.raises(DataError, match="columns"):
        of.read_fednoro_softlabels(narrow, expected_rows=1)


def test_a_softlabel_file_failing_its_content_check_is_moved_aside(file_server, tmp_path):
    entry = replace(of.official_file("fednoro_ich_softlabel"), rows=3, git_blob=None)
    pd.DataFrame({"id": ["a", "b"], **{f"p{j}": [0.2, 0.2] for j in range(5)}}).to_csv(
        file_server.root / "ICH_softlabel.csv", index=False
    )
    dest = tmp_path / "raw"
    with pytest.raises(DataError, match="2 rows, expected 3"):
        of.fetch_official("fednoro_ich_softlabel", dest, mirrors=[file_server.url], entry=entry)
    assert not (dest / "ICH_softlabel.csv").exists() and (dest / "ICH_softlabel.csv.corrupt").exists()
    pd.DataFrame({"id": ["a", "b", "c"], **{f"p{j}": [0.2] * 3 for j in range(5)}}).to_csv(
        file_server.root / "ICH_softlabel.csv", index=False
    )
    assert of.fetch_official("fednoro_ich_softlabel", dest, mirrors=[file_server.url], entry=entry).is_file()


def test_a_softlabel_file_with_another_git_blob_id_is_moved_aside(file_server, tmp_path):
    good = pd.DataFrame({"id": ["a", "b"], **{f"p{j}": [0.2, 0.2] for j in range(5)}})
    good.to_csv(file_server.root / "ICH_softlabel.csv", index=False)
    blob = of.git_blob_sha1(file_server.root / "ICH_softlabel.csv")
    entry = replace(of.official_file("fednoro_ich_softlabel"), rows=2)  # the real pin: the stand-in differs
    dest = tmp_path / "raw"
    with pytest.raises(ChecksumError, match="git blob id"):
        of.fetch_official("fednoro_ich_softlabel", dest, mirrors=[file_server.url], entry=entry)
    assert not (dest / "ICH_softlabel.csv").exists() and (dest / "ICH_softlabel.csv.corrupt").exists()
    entry = replace(entry, git_blob=blob)
    path = of.fetch_official("fednoro_ich_softlabel", dest, mirrors=[file_server.url], entry=entry)
    np.testing.assert_allclose(of.read_fednoro_softlabels(path, expected_rows=2), 0.2)


# ---- FedMLP index files ------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(FEDMLP_FIXTURES))
def test_fedmlp_index_round_trip_matches_the_pinned_content_hash(spec_data_dir, tmp_path, key):
    clients = clients_from_fixture(spec_data_dir / FEDMLP_FIXTURES[key])
    # the official file maps client -> collection; lists keep an arbitrary order exactly
    npy = save_dict_npy(
        tmp_path / of.official_file(key).remote.filename, {k: c.tolist() for k, c in enumerate(clients)}
    )
    loaded = of.load_fedmlp_clients(key, npy)
    assert len(loaded) == len(clients)
    for a, b in zip(loaded, clients):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.int64
    assert of.client_index_sha256(loaded) == of.official_file(key).content_sha256
    # the canonical export is the fixture's content (the fixture has CRLF line ends)
    assert of.client_index_export(loaded) == (spec_data_dir / FEDMLP_FIXTURES[key]).read_bytes().replace(b"\r\n", b"\n")


def test_fedmlp_assignment_wraps_the_lists_in_client_order(spec_data_dir, tmp_path):
    clients = clients_from_fixture(spec_data_dir / "fedmlp_ICH_client_indices.csv")
    npy = save_dict_npy(tmp_path / "ICH_1037_55000.npy", {k: c.tolist() for k, c in enumerate(clients)})
    assignment = of.fedmlp_assignment(of.load_fedmlp_clients("fedmlp_ich_clients", npy), num_samples=129_535)
    assert isinstance(assignment, ClientAssignment)
    assert assignment.sizes().tolist() == [5000] * 5
    assert assignment.clients[0][:2].tolist() == [14136, 72743]
    assert (assignment.client_of() >= 0).sum() == 25_000
    with pytest.raises(DataError, match="out of range"):
        of.fedmlp_assignment(clients, num_samples=129_532)


def test_tiny_index_file_keeps_each_sets_iteration_order_and_checks_content(tmp_path):
    sets = {0: {40, 8, 1000, 3, 72}, 1: {5, 37, 69}, 2: set()}
    npy = save_dict_npy(tmp_path / "tiny.npy", sets)
    clients = of.read_client_index_npy(npy)
    reference = np.load(npy, allow_pickle=True).item()  # what the official code iterates
    assert [c.tolist() for c in clients] == [list(reference[k]) for k in range(3)]
    expected = hashlib.sha256(
        ("client_id,position_in_client_list,train_csv_row_index\n"
         + "".join(f"{k},{p},{i}\n" for k in range(3) for p, i in enumerate(reference[k]))).encode()
    ).hexdigest()  # fmt: skip
    of.check_client_index_content(clients, expected, "tiny.npy")
    with pytest.raises(ChecksumError, match="tiny.npy") as info:
        of.check_client_index_content([clients[0][::-1], clients[1]], expected, "tiny.npy")
    assert expected in str(info.value)
    with pytest.raises(ChecksumError):
        of.load_fedmlp_clients("fedmlp_ich_clients", npy)  # not the published content


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.sets(st.integers(0, 200_000), max_size=60), min_size=1, max_size=5),
    st.booleans(),
)
def test_index_reader_reproduces_np_load_set_order(tmp_path, sets, as_numpy_ints):
    obj = {k: ({np.int64(i) for i in s} if as_numpy_ints else set(s)) for k, s in enumerate(sets)}
    buf = io.BytesIO()
    np.save(buf, obj, allow_pickle=True)
    path = tmp_path / "prop.npy"
    path.write_bytes(buf.getvalue())
    ours = of.read_client_index_npy(path)
    ref = np.load(path, allow_pickle=True).item()
    assert [c.tolist() for c in ours] == [[int(i) for i in ref[k]] for k in range(len(sets))]


def _npy_with_pickle(path: Path, payload: bytes) -> Path:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": ()})
    path.write_bytes(buf.getvalue() + payload)
    return path


def test_numpy1_style_index_file_loads(tmp_path):
    # numpy 1.x wrote protocol-3 pickles naming numpy.core.multiarray
    arr = np.empty((), dtype=object)
    arr[()] = {0: {np.int64(7), np.int64(3)}, 1: [np.int64(2)]}
    payload = pickle.dumps(arr, protocol=3).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in payload
    clients = of.read_client_index_npy(_npy_with_pickle(tmp_path / "old.npy", payload))
    assert [sorted(c.tolist()) for c in clients] == [[3, 7], [2]]


def test_index_reader_refuses_code_in_the_pickle(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = _npy_with_pickle(tmp_path / "evil.npy", pickle.dumps({0: Evil()}, protocol=3))
    with pytest.raises(DataError, match="refusing to load global"):
        of.read_client_index_npy(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "obj, match",
    [
        ({1: {1}, 2: {2}}, "keys must be 0..1"),
        ({0: "abc"}, "holds a str"),
        ([1, 2], "not a client index file|expected a dict"),
    ],
)
def test_index_files_of_another_layout_are_data_errors(tmp_path, obj, match):
    path = tmp_path / "x.npy"
    if isinstance(obj, list):
        np.save(path, np.array(obj))
    else:
        save_dict_npy(path, obj)
    with pytest.raises(DataError, match=match):
        of.read_client_index_npy(path)


def test_fetch_official_checks_index_content_and_moves_bad_files_aside(file_server, tmp_path):
    good = {0: [4, 1], 1: [3]}
    save_dict_npy(file_server.root / "ICH_1037_55000.npy", good)
    expected = of.client_index_sha256([np.array(v) for v in good.values()])
    entry = replace(of.official_file("fedmlp_ich_clients"), content_sha256=expected)
    dest = tmp_path / "raw"
    path = of.fetch_official("fedmlp_ich_clients", dest, mirrors=[file_server.url], entry=entry)
    assert [c.tolist() for c in of.read_client_index_npy(path)] == [[4, 1], [3]]
    save_dict_npy(file_server.root / "ICH_1037_55000.npy", {0: [1, 4], 1: [3]})
    path.unlink()
    with pytest.raises(ChecksumError, match="content check failed"):
        of.fetch_official("fedmlp_ich_clients", dest, mirrors=[file_server.url], entry=entry)
    assert not path.exists() and (dest / "ICH_1037_55000.npy.corrupt").exists()


# ---- raw-folder checks ------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["", "a", "a/b", "c"]), st.integers(0, 30), st.booleans()), max_size=40))
def test_find_missing_files_agrees_with_exists(tmp_path_factory, entries):
    root = tmp_path_factory.mktemp("tree")
    rel = []
    for folder, i, present in entries:
        name = f"{folder}/f{i}.png" if folder else f"f{i}.png"
        rel.append(name)
        if present:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).touch()
    mask = of.find_missing_files(root, rel)
    assert mask.tolist() == [not (root / r).exists() for r in rel]


def test_missing_manual_data_message_names_everything(tmp_path):
    err = of.missing_manual_data(
        "demo", tmp_path, ["x.csv (file)", "imgs/ (folder)"], source="SRC-URL", access="ACCEPT-RULES", layout=["x.csv"]
    )
    assert isinstance(err, MissingManualDataError)
    for part in (
        "x.csv (file)",
        "imgs/ (folder)",
        "SRC-URL",
        "ACCEPT-RULES",
        "data.datasets.demo.raw_dir",
        str(tmp_path),
    ):
        assert part in str(err)


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _tgz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("make", [_zip, _tgz])
def test_extract_archive_once_with_marker(tmp_path, make):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = make(raw / "a.bin", {"imgs/x.png": b"x", "imgs/sub/y.png": b"yy", "other/z.txt": b"z"})
    rec = of.extract_archive(arc, raw, "imgs", record={"checksum": "md5:0"})
    assert rec["members"] == 2 and rec["checksum"] == "md5:0"
    assert (raw / "imgs/x.png").read_bytes() == b"x" and (raw / "imgs/sub/y.png").read_bytes() == b"yy"
    assert not (raw / "other").exists()
    assert of.read_extraction_marker(raw, "a.bin") == rec
    assert [p.name for p in raw.iterdir() if p.name.endswith(".extracting")] == []
    # a second archive merges into the existing folder; a done archive is not read again
    arc2 = make(raw / "b.bin", {"imgs/w.png": b"w"})
    of.extract_archive(arc2, raw, "imgs")
    arc.unlink()
    assert of.extract_archive(arc, raw, "imgs") == rec
    assert sorted(p.name for p in (raw / "imgs").iterdir()) == ["sub", "w.png", "x.png"]


@pytest.mark.parametrize("make", [_zip, _tgz])
def test_extract_archive_refuses_paths_outside_the_folder(tmp_path, make):
    raw = tmp_path / "raw"
    raw.mkdir()
    arc = make(raw / "evil.bin", {"imgs/ok.png": b"1", "../escape.png": b"2"})
    with pytest.raises(DataError, match="outside"):
        of.extract_archive(arc, raw, "imgs")
    assert not (tmp_path / "escape.png").exists() and of.read_extraction_marker(raw, "evil.bin") is None
    assert not (raw / "imgs").exists()


def test_corrupt_archive_is_moved_aside_without_marker(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    good = _tgz(tmp_path / "g.tar.gz", {f"imgs/{i}.png": os.urandom(5000) for i in range(5)}).read_bytes()
    arc = raw / "c.tar.gz"
    arc.write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="corrupt or truncated") as info:
        of.extract_archive(arc, raw, "imgs")
    assert "c.tar.gz.corrupt" in str(info.value)
    assert not arc.exists() and (raw / "c.tar.gz.corrupt").exists()
    assert of.read_extraction_marker(raw, "c.tar.gz") is None and not (raw / "imgs").exists()


def test_parse_options_rejects_unknown_keys_and_bad_types():
    from fnlcore.datasets.isic import IsicOptions

    assert of.parse_options("isic2019", IsicOptions, {"split_seed": 3}).split_seed == 3
    with pytest.raises(ConfigError, match="unknown option.*'seed'"):
        of.parse_options("isic2019", IsicOptions, {"seed": 3})
    with pytest.raises(ConfigError, match="train_fraction"):
        of.parse_options("isic2019", IsicOptions, {"train_fraction": "0.7"})
    with pytest.raises(ConfigError, match="row_order"):
        of.parse_options("isic2019", IsicOptions, {"row_order": "random"})
