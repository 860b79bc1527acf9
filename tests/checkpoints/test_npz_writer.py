"""aps.npyio.write_npz: the archives a hash table's save writes, read back by numpy and zipfile."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aps.npyio import write_npz

DTYPES = [np.int64, np.int32, np.uint16, np.float32, np.float64, np.float16, np.bool_, np.int8, ">i4", "<U3"]


@settings(max_examples=80, deadline=None)
@given(arrays=st.lists(st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))), max_size=6))
def test_numpy_reads_back_every_array_as_written(tmp_path_factory, arrays):
    path = tmp_path_factory.mktemp("npz") / "a.npz"
    named = {f"a{k}": arr for k, arr in enumerate(arrays)}
    write_npz(path, named)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # every member's checksum holds
        assert z.namelist() == [f"{name}.npy" for name in named]
    with np.load(path, allow_pickle=False) as got:
        assert list(got.files) == list(named)
        for name, arr in named.items():
            assert got[name].dtype == arr.dtype and got[name].shape == arr.shape
            np.testing.assert_array_equal(got[name], arr)


def test_a_view_is_written_as_its_values_and_objects_are_refused(tmp_path: Path) -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    write_npz(tmp_path / "v.npz", {"cols": base[:, ::2], "rows": base[1:3]})
    with np.load(tmp_path / "v.npz") as got:
        np.testing.assert_array_equal(got["cols"], base[:, ::2])
        np.testing.assert_array_equal(got["rows"], base[1:3])
    with pytest.raises(ValueError, match="Python objects"):
        write_npz(tmp_path / "o.npz", {"o": np.array([{}, None], dtype=object)})
