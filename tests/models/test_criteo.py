"""Criteo text reader: the stable hash, the reference's normalisation, bad lines, formats, CRLF."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.errors import ConfigError, DataError
from aps.models.criteo import (
    HASH_BUCKETS,
    REFERENCE_CONT_DIFF,
    REFERENCE_CONT_MIN,
    CriteoFormat,
    CriteoRecords,
    fnv1a64,
    slot_id,
)
from aps.trainer.reader import Chunk

CRITEO = CriteoFormat()


def chunk(lines: list[str], first_line: int = 1, file: str = "part-0", eol: str = "\n") -> Chunk:
    data = "".join(line + eol for line in lines).encode("utf-8")
    return Chunk(file, first_line, data, len(lines))


def reference(lines: list[str], fmt: CriteoFormat = CRITEO) -> tuple[list[float], list[list[float]], list[list[int]]]:
    """The reference generator, line by line in Python, with slot_id in place of hash()."""
    labels, dense, ids = [], [], []
    for line in lines:
        f = line.rstrip("\n").split("\t")
        labels.append(float(int(f[0])))
        dense.append(
            [
                0.0 if f[1 + i] == "" else float(np.float32((float(f[1 + i]) - fmt.cont_min[i]) / fmt.cont_diff[i]))
                for i in range(fmt.dense)
            ]
        )
        first = 1 + fmt.dense
        ids.append([slot_id(first + k, f[first + k], fmt.buckets) for k in range(fmt.slots)])
    return labels, dense, ids


def assert_matches(rec: CriteoRecords, lines: list[str], fmt: CriteoFormat = CRITEO) -> None:
    labels, dense, ids = reference(lines, fmt)
    assert rec.n == len(lines)
    assert rec.labels.dtype == np.float32 and rec.dense.dtype == np.float32 and rec.ids.dtype == np.int64
    assert rec.dense.shape == (len(lines), fmt.dense) and rec.ids.shape == (len(lines), fmt.slots)
    assert rec.labels.tolist() == labels
    assert rec.dense.tolist() == dense
    assert rec.ids.tolist() == ids


def make_line(label: str = "1", dense: list[str] | None = None, cats: list[str] | None = None) -> str:
    dense = [""] * 13 if dense is None else dense
    cats = [""] * 26 if cats is None else cats
    return "\t".join([label, *dense, *cats])


def random_value(rng: np.random.Generator) -> str:
    kind = rng.integers(0, 6)
    if kind == 0:
        return ""
    if kind == 1:
        return "%08x" % rng.integers(0, 2**32)
    if kind == 2:  # unicode: accents, CJK, emoji, a '\r' inside a value (only a line-final one is dropped)
        alphabet = "aé漢字😀\r ß-Ω0"
        return "".join(alphabet[j] for j in rng.integers(0, len(alphabet), int(rng.integers(1, 12))))
    if kind == 3:  # long
        return "".join(chr(c) for c in rng.integers(33, 127, int(rng.integers(200, 3000))))
    if kind == 4:  # arbitrary printable ASCII incl. spaces
        return "".join(chr(c) for c in rng.integers(32, 127, int(rng.integers(1, 30))))
    return str(int(rng.integers(-(10**6), 10**6)))


# ---------------------------------------------------------------- the hash


def test_fnv1a64_known_vectors() -> None:
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8
    assert slot_id(14, "") == fnv1a64(b"14") % HASH_BUCKETS
    assert slot_id(14, "68fd1e64") == fnv1a64(b"1468fd1e64") % HASH_BUCKETS
    assert slot_id(20, "é") == fnv1a64("20é".encode()) % HASH_BUCKETS


def test_kernel_ids_equal_slot_id_for_random_values() -> None:
    rng = np.random.default_rng(1)
    lines = []
    for _ in range(300):
        cats = [random_value(rng) for _ in range(26)]
        if cats[-1].endswith("\r"):  # a line-final '\r' belongs to the line ending
            cats[-1] += "x"
        lines.append(make_line(str(rng.integers(0, 2)), [str(rng.integers(-3, 5000)) for _ in range(13)], cats))
    assert_matches(CRITEO.parse(chunk(lines)), lines)


@pytest.mark.parametrize("buckets", [1, 2, 97, 2**32 + 15, 2**63 - 1])
def test_modulo_is_unsigned_64_bit(buckets: int) -> None:
    """Half of all FNV values have the top bit set: a signed modulo would give other (negative) ids."""
    fmt = CriteoFormat(dense=0, slots=26, cont_min=(), cont_diff=(), buckets=buckets)
    rng = np.random.default_rng(buckets % 1000)
    lines = ["\t".join(["0"] + ["%08x" % rng.integers(0, 2**32) for _ in range(26)]) for _ in range(40)]
    rec = fmt.parse(chunk(lines))
    assert_matches(rec, lines, fmt)
    assert (rec.ids >= 0).all() and (rec.ids < buckets).all()
    if buckets == 2**63 - 1:
        fields = [(c, v) for line in lines for c, v in enumerate(line.split("\t")[1:], 1)]
        assert any(fnv1a64(f"{c}{v}".encode()) >= 2**63 for c, v in fields)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters="\t\n", blacklist_categories=("Cs",)), max_size=40),
                min_size=3, max_size=3))
def test_hash_agrees_with_slot_id_on_any_text(values: list[str]) -> None:
    fmt = CriteoFormat(dense=0, slots=3, cont_min=(), cont_diff=())
    if values[-1].endswith("\r"):
        values[-1] += "."
    rec = fmt.parse(chunk(["\t".join(["1", *values])]))
    assert rec.ids[0].tolist() == [slot_id(1 + k, v) for k, v in enumerate(values)]


# ---------------------------------------------------------------- good lines


def test_handwritten_lines_parse_exactly() -> None:
    d1 = ["5", "-3", "+50", "", "64000", "0", "", "", "", "", "", "", "100"]
    c1 = ["68fd1e64", "80e26c9b", "", *(["a"] * 22), "e8b83407"]
    d2 = ["0"] + ["600"] + ["-0"] + [""] * 10
    lines = [make_line("1", d1, c1), make_line("0", d2, [""] * 26)]
    rec = CRITEO.parse(chunk(lines))
    assert rec.n == 2 and rec.bad_lines == 0
    assert rec.labels.tolist() == [1.0, 0.0]
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert rec.dense[0].tolist() == [0.25, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    assert rec.dense[1].tolist() == [0.0, f32(603 / 603), 0.0] + [0.0] * 10
    assert rec.ids[0, 0] == fnv1a64(b"1468fd1e64") % 1000001
    assert rec.ids[0, 1] == fnv1a64(b"1580e26c9b") % 1000001
    assert rec.ids[0, 2] == fnv1a64(b"16") % 1000001  # empty value: just the column number
    assert rec.ids[0, 25] == fnv1a64(b"39e8b83407") % 1000001
    assert rec.ids[1].tolist() == [fnv1a64(str(c).encode()) % 1000001 for c in range(14, 40)]
    assert_matches(rec, lines)


def test_normalisation_is_float64_then_float32() -> None:
    rng = np.random.default_rng(5)
    lines = [make_line("0", [str(int(x)) for x in rng.integers(-10**9, 10**9, 13)]) for _ in range(50)]
    rec = CRITEO.parse(chunk(lines))
    for row, line in zip(rec.dense, lines):
        xs = [int(v) for v in line.split("\t")[1:14]]
        consts = zip(xs, REFERENCE_CONT_MIN, REFERENCE_CONT_DIFF)
        assert row.tolist() == [float(np.float32((x - m) / d)) for x, m, d in consts]


def test_crlf_line_endings_parse_like_lf() -> None:
    rng = np.random.default_rng(3)
    lines = [
        make_line("1", [str(x) for x in rng.integers(0, 99, 13)], ["%06x" % x for x in rng.integers(0, 2**24, 26)])
        for _ in range(20)
    ]
    lines.append(make_line("0", ["7"] + [""] * 12, [""] * 26))  # empty last field before '\r'
    lines.append("\t".join(["1", *([""] * 12), "42", *(["v"] * 26)]))
    lf = CRITEO.parse(chunk(lines))
    crlf = CRITEO.parse(chunk(lines, eol="\r\n"))
    assert_matches(crlf, lines)
    for a, b in ((lf.labels, crlf.labels), (lf.dense, crlf.dense), (lf.ids, crlf.ids)):
        assert np.array_equal(a, b)
    # a last dense field (dense-only format) and a last label before '\r\n'
    fmt = CriteoFormat(dense=2, slots=1, cont_min=(0, 0), cont_diff=(1, 1))
    rec = fmt.parse(Chunk("f", 1, b"1\t3\t4\tz\r\n0\t\t\t\r\n", 2))
    assert rec.labels.tolist() == [1.0, 0.0] and rec.dense.tolist() == [[3.0, 4.0], [0.0, 0.0]]
    assert rec.ids.tolist() == [[slot_id(3, "z")], [slot_id(3, "")]]


def test_empty_chunk_and_missing_final_newline() -> None:
    rec = CRITEO.parse(Chunk("f", 1, b"", 0))
    assert rec.n == 0 and rec.dense.shape == (0, 13) and rec.ids.shape == (0, 26) and rec.bad_lines == 0
    line = make_line("1", ["1"] * 13, ["x"] * 26)
    rec = CRITEO.parse(Chunk("f", 1, line.encode(), 1))
    assert_matches(rec, [line])


def test_chunk_with_more_lines_than_it_says_is_an_error() -> None:
    line = make_line()
    with pytest.raises(DataError, match="more lines") as info:
        CRITEO.parse(Chunk("f", 10, (line + "\n" + line + "\n").encode(), 1))
    assert info.value.line == 11


# ---------------------------------------------------------------- bad lines

GOOD = make_line("1", ["1"] * 13, ["abc"] * 26)
BAD_LINES = [
    (make_line("2"), "label is not 0 or 1: '2' (field 0)"),
    (make_line(""), "label is not 0 or 1: '' (field 0)"),
    (make_line("01"), "label is not 0 or 1: '01' (field 0)"),
    (make_line("1.0"), "label is not 0 or 1"),
    (make_line("1", ["1", "2", "1.5"] + [""] * 10), "dense field I3 is not an integer: '1.5' (field 3)"),
    (make_line("1", ["abc"] + [""] * 12), "dense field I1 is not an integer: 'abc' (field 1)"),
    (make_line("1", [""] * 12 + ["-"]), "dense field I13 is not an integer: '-' (field 13)"),
    (make_line("1", ["+"] + [""] * 12), "dense field I1 is not an integer"),
    (make_line("1", [" 3"] + [""] * 12), "dense field I1 is not an integer: ' 3'"),
    (make_line("1", ["1e5"] + [""] * 12), "dense field I1 is not an integer: '1e5'"),
    (make_line("1", ["3\r"] + [""] * 12), "dense field I1 is not an integer"),
    (make_line("1", ["99999999999999999999"] + [""] * 12), "dense field I1 is out of the int64 range"),
    ("\t".join(GOOD.split("\t")[:-1]), "line has 39 fields, expected 40"),
    (GOOD + "\textra", "line has 41 fields, expected 40"),
    (GOOD + "\t", "line has 41 fields, expected 40"),
    ("1\t2\t1.5", "line has 3 fields"),  # the count is named before the bad dense value
    ("", "empty line, expected 40 tab-separated fields"),
    ("\r", "empty line"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_LINES)
def test_bad_line_raises_with_file_and_line(bad: str, message: str) -> None:
    lines = [GOOD, GOOD, bad, GOOD]
    with pytest.raises(DataError) as info:
        CRITEO.parse(chunk(lines, first_line=1000, file="day_0.txt"))
    assert info.value.file == "day_0.txt" and info.value.line == 1002
    assert message in str(info.value)
    assert str(info.value).startswith("day_0.txt:1002: ")


def test_skip_bad_lines_counts_them_and_keeps_good_lines_in_order() -> None:
    rng = np.random.default_rng(11)
    goods = [make_line(str(rng.integers(0, 2)), [str(rng.integers(0, 9)) for _ in range(13)],
                       ["%x" % rng.integers(0, 2**30) for _ in range(26)]) for _ in range(len(BAD_LINES) + 3)]
    lines, kept = [], []
    for k, good in enumerate(goods):
        lines.append(good)
        kept.append(good)
        if k < len(BAD_LINES):
            lines.append(BAD_LINES[k][0])
    lines.insert(0, BAD_LINES[0][0])
    lines.append(BAD_LINES[-1][0])
    rec = CRITEO.parse(chunk(lines, first_line=50), skip_bad_lines=True)
    assert rec.bad_lines == len(BAD_LINES) + 2
    assert_matches(rec, kept)
    rec = CRITEO.parse(chunk(lines, first_line=50, eol="\r\n"), skip_bad_lines=True)
    assert rec.bad_lines == len(BAD_LINES) + 2
    assert_matches(rec, kept)
    only_bad = CRITEO.parse(chunk([b for b, _ in BAD_LINES]), skip_bad_lines=True)
    assert only_bad.n == 0 and only_bad.bad_lines == len(BAD_LINES) and only_bad.ids.shape == (0, 26)


# ---------------------------------------------------------------- formats


def test_custom_format() -> None:
    fmt = CriteoFormat(dense=2, slots=3, cont_min=[1, -2.5], cont_diff=[4, 0.5], buckets=1000)
    assert fmt.cont_min == (1.0, -2.5) and fmt.cont_diff == (4.0, 0.5) and fmt.fields == 6
    lines = ["1\t5\t-2\tfoo\t\tbär", "0\t\t7\tx\ty\tz"]
    rec = fmt.parse(chunk(lines))
    assert rec.labels.tolist() == [1.0, 0.0]
    assert rec.dense.tolist() == [[1.0, 1.0], [0.0, 19.0]]
    assert rec.ids.tolist() == [[slot_id(3, "foo", 1000), slot_id(4, "", 1000), slot_id(5, "bär", 1000)],
                                [slot_id(3, "x", 1000), slot_id(4, "y", 1000), slot_id(5, "z", 1000)]]
    expected = r"has 5 fields, expected 6 tab-separated fields \(label, 2 dense, 3 categorical\)"
    with pytest.raises(DataError, match=expected):
        fmt.parse(chunk(["1\t5\t-2\tfoo\t"]))
    with pytest.raises(DataError, match="dense field I2 is not an integer: 'x' \\(field 2\\)"):
        fmt.parse(chunk(["1\t5\tx\tfoo\t\t"]))
    assert pickle.loads(pickle.dumps(fmt)) == fmt and hash(fmt) == hash(pickle.loads(pickle.dumps(fmt)))
    assert CriteoFormat(cont_min=list(REFERENCE_CONT_MIN)) == CRITEO


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dense": 2}, "cont_min has 13 values, but dense is 2"),
        ({"cont_diff": REFERENCE_CONT_DIFF[:-1]}, "cont_diff has 12 values, but dense is 13"),
        ({"cont_diff": (0,) + REFERENCE_CONT_DIFF[1:]}, r"cont_diff\[0\] must be > 0"),
        ({"cont_diff": REFERENCE_CONT_DIFF[:5] + (-1,) + REFERENCE_CONT_DIFF[6:]}, r"cont_diff\[5\] must be > 0"),
        ({"cont_min": ("a",) + REFERENCE_CONT_MIN[1:]}, r"cont_min\[0\] must be a number"),
        ({"cont_min": (float("nan"),) + REFERENCE_CONT_MIN[1:]}, r"cont_min\[0\] must be finite"),
        ({"dense": -1, "cont_min": (), "cont_diff": ()}, "dense must be >= 0"),
        ({"slots": 0}, "slots must be >= 1"),
        ({"buckets": 0}, "buckets must be in"),
        ({"buckets": 2**63}, "buckets must be in"),
        ({"slots": 2.0}, "slots must be an integer"),
        ({"dense": True}, "dense must be an integer"),
    ],
)
def test_format_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CriteoFormat(**kwargs)


def test_from_meta_reads_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "meta.json"
    path.write_text(json.dumps({"dense": 2, "slots": 3, "cont_min": [0, -1], "cont_diff": [10, 2.5], "buckets": 77}))
    assert CriteoFormat.from_meta(path) == CriteoFormat(2, 3, (0, -1), (10, 2.5), 77)
    path.write_text(json.dumps({"dense": 13, "slots": 26, "cont_min": list(REFERENCE_CONT_MIN),
                                "cont_diff": list(REFERENCE_CONT_DIFF)}))
    assert CriteoFormat.from_meta(str(path)) == CRITEO  # buckets defaults to the reference's
    path.write_text(json.dumps({"dense": 1, "slots": 1, "cont_min": [0], "cont_diff": [1], "train_lines": 5}))
    assert CriteoFormat.from_meta(path) == CriteoFormat(1, 1, (0,), (1,))  # descriptive keys are ignored


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"dense": 1, "slots": 1, "cont_min": [0]}', "field 'cont_diff' is missing"),
        ('{"dense": 1, "slots": 1, "cont_min": 0, "cont_diff": [1]}', "field 'cont_min' must be a list"),
        ('{"dense": 2, "slots": 1, "cont_min": [0], "cont_diff": [1, 1]}', "field cont_min has 1 values, but dense"),
        ('{"dense": 1, "slots": 1, "cont_min": [0], "cont_diff": [0]}', r"field cont_diff\[0\] must be > 0"),
        ('{"dense": 1, "slots": 1, "cont_min": [null], "cont_diff": [1]}', r"field cont_min\[0\] must be a number"),
        ('{"dense": "1", "slots": 1, "cont_min": [0], "cont_diff": [1]}', "field dense must be an integer"),
        ('{"dense": 1, "slots": 1, "cont_min": [0], "cont_diff": [1], "buckets": 0}', "field buckets must be in"),
    ],
)
def test_from_meta_rejects_a_bad_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "meta.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as info:
        CriteoFormat.from_meta(path)
    assert str(info.value).startswith(str(path))


def test_from_meta_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read Criteo meta file") as info:
        CriteoFormat.from_meta(tmp_path / "nope.json")
    assert str(tmp_path / "nope.json") in str(info.value)
