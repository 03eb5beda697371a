"""Safe loading (no unpickling) and atomic writing, `lvflow/_workflow/io.py`."""

import json
import os
import pickle

import numpy as np
import pytest

from lvflow import LvflowError

# internal on purpose: the CLI's safe-loading and atomic-writing layer is what this file tests
from lvflow._workflow.io import atomic_write_bytes, load_array, load_arrays, save_json, save_npz, to_json


def test_npz_npy_csv_roundtrip(tmp_path):
    r, C = np.array([1.0, 0.5]), np.array([[1.0, 0.2], [0.2, 2.0]])
    np.savez(tmp_path / "a.npz", r=r, C=C)
    got = load_arrays(tmp_path / "a.npz")
    assert set(got) == {"r", "C"} and np.array_equal(got["C"], C) and got["r"].dtype == np.float64
    np.save(tmp_path / "b.npy", C.astype(np.float32))
    assert np.array_equal(load_array(tmp_path / "b.npy"), C.astype(np.float32).astype(float))
    (tmp_path / "c.csv").write_text("# comment\n1,2,3\n4,5,6\n")
    assert np.array_equal(load_array(tmp_path / "c.csv"), [[1, 2, 3], [4, 5, 6]])
    # A header names columns; indexed names (C0, C1) stack into one 2-D array.
    (tmp_path / "d.csv").write_text("r,C0,C1\n1,1,0.2\n0.5,0.2,2\n")
    got = load_arrays(tmp_path / "d.csv")
    assert np.array_equal(got["r"], r) and np.array_equal(got["C"], C)


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_pickled_data_refused(tmp_path, suffix):
    f = tmp_path / f"evil{suffix}"
    obj = np.array([{"a": 1}, None], dtype=object)
    if suffix == ".npy":
        np.save(f, obj, allow_pickle=True)
    else:
        np.savez(f, r=obj)
    with pytest.raises(LvflowError, match="pickled"):
        load_arrays(f, name="--system")
    # A raw pickle with an .npy name is refused too, without ever being unpickled.
    raw = tmp_path / "raw.npy"
    raw.write_bytes(pickle.dumps([1.0, 2.0]))
    with pytest.raises(LvflowError, match="--system.*pickled"):
        load_arrays(raw, name="--system")


def test_bad_files(tmp_path):
    with pytest.raises(LvflowError, match=r"^--data: file not found"):
        load_arrays(tmp_path / "nope.npz", name="--data")
    with pytest.raises(LvflowError, match="directory"):
        load_arrays(tmp_path, name="--data")
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(LvflowError, match="unsupported file type '.txt'"):
        load_arrays(tmp_path / "x.txt")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(LvflowError, match="not a valid .npz file"):
        load_arrays(tmp_path / "bad.npz")
    np.save(tmp_path / "arr.npy", np.eye(2))
    (tmp_path / "arr.npy").rename(tmp_path / "arr.npz")
    with pytest.raises(LvflowError, match=r"arr\.npz is an \.npy file with a \.npz suffix"):
        load_arrays(tmp_path / "arr.npz")
    np.savez(tmp_path / "zip.npz", x=np.eye(2))
    (tmp_path / "zip.npz").rename(tmp_path / "zip.npy")
    with pytest.raises(LvflowError, match=r"zip\.npy is an \.npz archive with a \.npy suffix"):
        load_arrays(tmp_path / "zip.npy")
    (tmp_path / "trunc.npy").write_bytes(b"\x93NUMPY\x01")
    with pytest.raises(LvflowError, match="cannot read"):
        load_arrays(tmp_path / "trunc.npy")
    (tmp_path / "ragged.csv").write_text("1,2\n3\n")
    with pytest.raises(LvflowError, match="different lengths"):
        load_arrays(tmp_path / "ragged.csv")
    (tmp_path / "words.csv").write_text("a,b\n1,x\n")
    with pytest.raises(LvflowError, match="not numeric"):
        load_arrays(tmp_path / "words.csv")
    (tmp_path / "empty.csv").write_text("\n")
    with pytest.raises(LvflowError, match="empty"):
        load_arrays(tmp_path / "empty.csv")
    np.savez(tmp_path / "two.npz", a=np.ones(2), b=np.ones(2))
    with pytest.raises(LvflowError, match="single array"):
        load_array(tmp_path / "two.npz")
    if os.name == "posix" and os.geteuid() != 0:
        f = tmp_path / "locked.npy"
        np.save(f, np.ones(2))
        f.chmod(0)
        with pytest.raises(LvflowError, match="not readable"):
            load_arrays(f)


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    f = tmp_path / "out.json"
    f.write_text("old")
    save_json(f, {"a": np.arange(3), "b": np.float64(np.inf), "c": "s"})
    assert json.loads(f.read_text()) == {"a": [0, 1, 2], "b": None, "c": "s"}
    assert os.listdir(tmp_path) == ["out.json"]
    umask = os.umask(0o022)
    try:
        save_json(tmp_path / "new.json", {})
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o644  # as open() would, not mkstemp's 0600
    finally:
        os.umask(umask)
    (tmp_path / "new.json").unlink()

    # A failure mid-write leaves the old file intact and no temporary behind.
    def failing(*a, **k):
        raise OSError("disk full")

    orig = os.fsync
    os.fsync = failing
    try:
        with pytest.raises(LvflowError, match="cannot write .*out.json: disk full"):
            atomic_write_bytes(f, b"new")
    finally:
        os.fsync = orig
    assert json.loads(f.read_text())["c"] == "s"
    assert os.listdir(tmp_path) == ["out.json"]
    with pytest.raises(LvflowError, match="directory does not exist"):
        atomic_write_bytes(tmp_path / "no" / "x.json", b"")


def test_save_npz_loads_without_pickle(tmp_path):
    f = tmp_path / "o.npz"
    save_npz(f, {"t": np.linspace(0, 1, 3), "name": np.array("mlp"), "skip": None})
    with np.load(f, allow_pickle=False) as z:
        assert set(z.files) == {"t", "name"} and str(z["name"]) == "mlp"
    assert json.loads(to_json({"x": [np.nan, 1.0]})) == {"x": [None, 1.0]}
