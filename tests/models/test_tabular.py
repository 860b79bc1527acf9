"""aps.models.tabular: the Criteo layout widened with several labels and list columns, parsed in
one numba pass; the Criteo lines parse to the Criteo reader's arrays bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aps.errors import ConfigError, DataError
from aps.models.criteo import CriteoFormat, slot_key
from aps.models.tabular import ListColumn, TabularFormat
from aps.trainer.reader import Chunk
from tests.models.test_ctr_step_equality import make_lines

BASE = CriteoFormat(dense=2, slots=3, cont_min=[0, 0], cont_diff=[10, 4], buckets=60)
WIDE = TabularFormat(BASE, 2, (ListColumn("hist", 3, shares=1), ListColumn("tags", 2, separator="|")))


def chunk(text: str, first_line: int = 1) -> Chunk:
    data = text.encode()
    return Chunk("part-0", first_line, data, data.count(b"\n"))


@pytest.mark.parametrize("full_keys", [False, True])
def test_criteo_lines_parse_as_the_criteo_reader_does(full_keys: bool) -> None:
    c = chunk("\n".join(make_lines(1)) + "\n")
    want, got = BASE.parse(c, full_keys=full_keys), TabularFormat(BASE).parse(c, full_keys=full_keys)
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.dense, want.dense)
    assert np.array_equal(got.labels[:, 0], want.labels) and got.values.size == 0


def test_labels_lists_and_a_list_sharing_a_slot() -> None:
    rec = WIDE.parse(chunk("1\t0\t5\t\ta\tb\tc\tb,x\tq|r\n0\t1\t\t3\ta\tb\tc\t\t\n"), full_keys=True)
    assert rec.labels.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert rec.counts.tolist() == [[2, 2], [0, 0]] and rec.offsets.tolist() == [[0, 2], [4, 4]]
    # slot 1 is field 5 (2 labels, 2 dense): "b" in the shared list is that slot's key
    assert rec.values[0] == rec.ids[0, 1] == slot_key(5, "b")
    assert rec.values[1] == slot_key(5, "x") and rec.values[2] == slot_key(8, "q")  # tags: its own field, 8


@pytest.mark.parametrize("line, what", [
    ("1\t0\t5\t\ta\tb\tc\tb,x,y,z\tq", "list 'hist' holds more than its max_len 3 values"),
    ("1\t0\t5\t\ta\tb\tc\tb,,x\tq", "list 'hist' has an empty value between separators"),
    ("1\t5\t\ta\tb\tc\tb\tq", "line has 8 fields, expected 9 tab-separated fields (2 label"),  # one label of two
    ("1\t2\t5\t\ta\tb\tc\tb\tq", "label is not 0 or 1: '2' (field 1)"),
    ("1\t0\t5x\t\ta\tb\tc\tb\tq", "dense field 0 is not an integer: '5x' (field 2)"),
])
def test_a_bad_line_is_named_with_its_file_line_and_field(line: str, what: str) -> None:
    text = "1\t0\t5\t\ta\tb\tc\tb\tq\n" + line + "\n"
    with pytest.raises(DataError) as bad:
        WIDE.parse(chunk(text, first_line=41))
    assert what in str(bad.value) and bad.value.file == "part-0" and bad.value.line == 42
    rec = WIDE.parse(chunk(text), skip_bad_lines=True)  # or skipped and counted, its values dropped
    assert (rec.n, rec.bad_lines, rec.values.size) == (1, 1, 2)  # the good line's "b" and "q"


def test_meta_json_declares_labels_and_lists(tmp_path: Path) -> None:
    meta = {"dense": 2, "slots": 3, "cont_min": [0, 0], "cont_diff": [10, 4], "labels": 2,
            "lists": [{"name": "hist", "max_len": 3, "shares": 1}, {"name": "tags", "max_len": 2, "separator": "|"}]}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    fmt = TabularFormat.from_meta(tmp_path / "meta.json")
    assert (fmt.labels, fmt.fields, [c.name for c in fmt.lists], fmt.is_criteo) == (2, 9, ["hist", "tags"], False)
    for bad, says in [({"name": "h", "max_len": 0}, "max_len"), ({"name": "h", "max_len": 2, "shares": 3}, "shares"),
                      ({"name": "h", "max_len": 2, "separator": "\t"}, "separator"), ({"max_len": 2}, "name"),
                      ({"name": "h", "max_len": 2, "pool": "sum"}, "unknown field")]:
        (tmp_path / "meta.json").write_text(json.dumps({**meta, "lists": [bad]}))
        with pytest.raises(ConfigError, match=says):
            TabularFormat.from_meta(tmp_path / "meta.json")
