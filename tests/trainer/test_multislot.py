"""MultiSlot parsing: numba kernel vs a pure-Python reference, and every kind of bad line."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.errors import ConfigError, DataError
from aps.trainer.multislot import MultiSlotFormat, Slot, SlotBatch, format_multislot
from aps.trainer.reader import Chunk, read_chunks

INT_RE = re.compile(rb"[+-]?[0-9]+")
FLOAT_RE = re.compile(rb"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
INT64_MAX = 2**63 - 1

CRITEO = MultiSlotFormat(
    [Slot("click", "int64"), Slot("dense", "float32")] + [Slot(f"C{k}", "int64") for k in range(1, 27)]
)


def reference_parse(data: bytes, slots: list[Slot]) -> dict[str, tuple[list, list[int]]]:
    """The obvious, slow parser: split every line and convert token by token."""
    out = {s.name: ([], [0]) for s in slots}
    for line in data.split(b"\n")[:-1]:
        toks = line.replace(b"\t", b" ").replace(b"\r", b" ").split()
        k = 0
        for s in slots:
            size = int(toks[k])
            vals = toks[k + 1 : k + 1 + size]
            assert size >= 0 and len(vals) == size
            k += 1 + size
            for t in vals:
                if s.dtype == "int64":
                    assert INT_RE.fullmatch(t) and abs(int(t)) <= INT64_MAX
                    out[s.name][0].append(int(t))
                else:
                    assert FLOAT_RE.fullmatch(t)
                    out[s.name][0].append(np.float32(float(t)))
            out[s.name][1].append(out[s.name][1][-1] + size)
        assert k == len(toks)
    return out


def chunk(data: bytes, first_line: int = 1, file: str = "mem") -> Chunk:
    return Chunk(file, first_line, data, data.count(b"\n"))


int_tokens = st.integers(-INT64_MAX, INT64_MAX).map(str) | st.integers(0, 999).map(lambda v: f"+{v:03d}")
float_tokens = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**9), 10**9).map(str),
    st.builds(lambda i, f, e: f"{i}.{f}e{e}", st.integers(-999, 999), st.integers(0, 99999), st.integers(-30, 30)),
    st.builds(lambda i: f"{i}.", st.integers(0, 10**6)),
    st.builds(lambda f: f".{f}", st.integers(0, 10**6)),
    st.builds(lambda m, e: f"{m}E+{e}", st.integers(1, 9), st.integers(0, 37)),
)
separators = st.sampled_from([" ", "  ", "\t", " \t"])


@st.composite
def multislot_data(draw):
    dtypes = draw(st.lists(st.sampled_from(["int64", "float32"]), min_size=1, max_size=6))
    slots = [Slot(f"s{k}", d) for k, d in enumerate(dtypes)]
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        tokens = []
        for s in slots:
            vals = draw(st.lists(int_tokens if s.dtype == "int64" else float_tokens, max_size=4))
            tokens += [str(len(vals))] + vals
        sep = draw(separators)
        trailing = draw(st.sampled_from(["", " ", "\r"]))
        lines.append(sep.join(tokens) + trailing + "\n")
    return slots, "".join(lines).encode()


def check_against_reference(slots: list[Slot], data: bytes) -> None:
    batch = MultiSlotFormat(slots).parse(chunk(data))
    expected = reference_parse(data, slots)
    assert batch.num_lines == data.count(b"\n") and batch.bad_lines == 0
    for s in slots:
        values, offsets = batch.slots[s.name]
        assert values.dtype == (np.int64 if s.dtype == "int64" else np.float32)
        assert offsets.dtype == np.int64 and offsets.tolist() == expected[s.name][1]
        np.testing.assert_array_equal(values, np.array(expected[s.name][0], dtype=values.dtype))


@settings(max_examples=120, deadline=None)
@given(multislot_data())
def test_parse_matches_reference(case):
    check_against_reference(*case)


def random_token(rng: np.random.Generator, dtype: str) -> str:
    kind = int(rng.integers(0, 6))
    if dtype == "int64" or kind == 0:
        return str(int(rng.integers(-(2**63) + 1, 2**63 - 1)) >> int(rng.integers(0, 63)))
    if kind == 1:
        return repr(float(np.float32(rng.normal() * 10.0 ** rng.integers(-40, 39))))
    if kind == 2:
        return f"{rng.normal():.{int(rng.integers(0, 12))}f}"
    if kind == 3:
        return f"{rng.normal():.{int(rng.integers(0, 20))}e}"
    if kind == 4:
        return f"{rng.integers(0, 1000)}.{'0' * int(rng.integers(0, 30))}{rng.integers(0, 10**6)}"
    return f"{rng.normal() * 1e5:.3g}"


@pytest.mark.parametrize("seed", range(4))
def test_parse_matches_reference_on_larger_random_data(seed):
    rng = np.random.default_rng(seed)
    slots = [Slot(f"s{k}", str(rng.choice(["int64", "float32"]))) for k in range(int(rng.integers(1, 12)))]
    lines = []
    for _ in range(1500):
        toks = []
        for s in slots:
            size = int(rng.integers(0, 7))
            toks += [str(size)] + [random_token(rng, s.dtype) for _ in range(size)]
        lines.append(" ".join(toks) + "\n")
    check_against_reference(slots, "".join(lines).encode())


def test_parse_simple_values():
    fmt = MultiSlotFormat([Slot("click", "int64"), Slot("dense", "float32"), Slot("ids", "int64")])
    batch = fmt.parse(chunk(b"1 0 3 0.1 -3e-5 1. 2 5 6\n1 1 0 0\n1 -7 1 12 1 9223372036854775807\n", 10, "f"))
    assert isinstance(batch, SlotBatch)
    assert (batch.num_lines, batch.bad_lines, batch.first_line, batch.file) == (3, 0, 10, "f")
    click, click_off = batch.slots["click"]
    assert click.tolist() == [0, 1, -7] and click_off.tolist() == [0, 1, 2, 3]
    dense, dense_off = batch.slots["dense"]
    np.testing.assert_array_equal(dense, np.array([0.1, -3e-5, 1.0, 12.0], dtype=np.float32))
    assert dense_off.tolist() == [0, 3, 3, 4]
    ids, ids_off = batch.slots["ids"]
    assert ids.tolist() == [5, 6, 2**63 - 1] and ids_off.tolist() == [0, 2, 2, 3]


def test_parse_empty_chunk():
    batch = CRITEO.parse(chunk(b""))
    assert batch.num_lines == 0 and all(off.tolist() == [0] and len(v) == 0 for v, off in batch.slots.values())


def criteo_line(rng: np.random.Generator) -> str:
    dense = [round(float(x), 6) for x in rng.random(13)]
    sample = [("click", [int(rng.integers(0, 2))]), ("dense", dense)]
    sample += [(f"C{k}", [int(rng.integers(0, 1_000_001))]) for k in range(1, 27)]
    return format_multislot(sample)


def test_criteo_shaped_line_parses():
    rng = np.random.default_rng(7)
    lines = [criteo_line(rng) for _ in range(3)]
    assert len(lines[0].split()) == 2 + 14 + 26 * 2
    batch = CRITEO.parse(chunk(("\n".join(lines) + "\n").encode()))
    assert batch.num_lines == 3
    for i, line in enumerate(lines):
        toks = line.split()
        assert batch.slots["click"][0][i] == int(toks[1])
        np.testing.assert_array_equal(
            batch.slots["dense"][0][13 * i : 13 * i + 13], np.array([float(t) for t in toks[3:16]], dtype=np.float32)
        )
        assert [int(batch.slots[f"C{k}"][0][i]) for k in range(1, 27)] == [int(t) for t in toks[17::2]]
    assert batch.slots["dense"][1].tolist() == [0, 13, 26, 39]


FMT = MultiSlotFormat([Slot("label", "int64"), Slot("dense", "float32"), Slot("ids", "int64")])
GOOD = b"1 1 2 0.5 1e-3 2 10 20\n"
BAD_LINES = [
    (b"1 1 2 0.5 1e-3 2 10\n", "'ids'", "fewer values"),  # too few values
    (b"1 1 2 0.5 1e-3 2 10 20 30\n", "'ids'", "extra tokens"),  # too many values / trailing token
    (b"1 1 2 0.5 abc 2 10 20\n", "'dense'", "not a number"),  # non-numeric float
    (b"1 1 2 0.5 1e-3 2 10 2x\n", "'ids'", "not an int64"),  # non-numeric int
    (b"1 1 2 0.5 1e-3 2 10 2.5\n", "'ids'", "not an int64"),  # float token in an int slot
    (b"1 1 -2 0.5 1e-3 2 10 20\n", "'dense'", "negative"),  # size < 0
    (b"1 1 x 0.5 1e-3 2 10 20\n", "'dense'", "size is not"),  # non-numeric size
    (b"1 1 2 0.5 1e-3\n", "'ids'", "missing"),  # missing slot
    (b"\n", "'label'", "missing"),  # empty line
    (b"1 1 2 0.5 1e 2 10 20\n", "'dense'", "not a number"),  # exponent without digits
    (b"1 1 2 0.5 nan 2 10 20\n", "'dense'", "not a number"),  # no nan/inf in text data
    (b"1 99999999999999999999 2 0.5 1 0\n", "'label'", "not an int64"),  # int64 overflow
]


@pytest.mark.parametrize("bad,slot,what", BAD_LINES)
def test_bad_line_reports_file_line_and_slot(bad, slot, what):
    data = GOOD * 4 + bad + GOOD * 2
    with pytest.raises(DataError) as info:
        FMT.parse(chunk(data, first_line=101, file="part-7"))
    assert info.value.file == "part-7" and info.value.line == 105
    assert slot in str(info.value) and what in str(info.value)


@pytest.mark.parametrize("bad,slot,what", BAD_LINES)
def test_skip_bad_lines_counts_and_keeps_the_rest(bad, slot, what):
    data = GOOD + bad + b"1 2 1 -4 0\n" + bad + GOOD
    batch = FMT.parse(chunk(data), skip_bad_lines=True)
    assert (batch.num_lines, batch.bad_lines) == (3, 2)
    assert batch.slots["label"][0].tolist() == [1, 2, 1]
    np.testing.assert_array_equal(batch.slots["dense"][0], np.array([0.5, 1e-3, -4, 0.5, 1e-3], np.float32))
    assert batch.slots["dense"][1].tolist() == [0, 2, 3, 5]
    assert batch.slots["ids"][0].tolist() == [10, 20, 10, 20]
    assert batch.slots["ids"][1].tolist() == [0, 2, 2, 4]


async def test_line_numbers_from_a_multi_chunk_file(tmp_path):
    path = tmp_path / "part-0"
    lines = [GOOD] * 57 + [b"1 1 2 0.5 oops 2 10 20\n"] + [GOOD] * 20
    path.write_bytes(b"".join(lines))
    parsed = 0
    with pytest.raises(DataError) as info:
        async for c in read_chunks(str(path), chunk_bytes=100):
            parsed += FMT.parse(c).num_lines
    assert info.value.file == str(path) and info.value.line == 58
    assert parsed < 57  # the chunks before the bad one parsed fine


def test_format_validation():
    with pytest.raises(ConfigError):
        MultiSlotFormat([])
    with pytest.raises(ConfigError):
        MultiSlotFormat([Slot("a", "int64"), Slot("a", "float32")])
    with pytest.raises(ConfigError):
        MultiSlotFormat([Slot("a", "float64")])  # type: ignore[arg-type]


def test_format_multislot():
    assert format_multislot([("a", [1, 2]), ("b", [0.5]), ("c", [])]) == "2 1 2 1 0.5 0"
    assert format_multislot([("d", np.array([0.1, 2], dtype=np.float32)), ("e", np.array([7]))]) == "2 0.1 2.0 1 7"
    assert format_multislot(zip(["x"], [[True]])) == "1 1"
    for bad in ([("a", [float("nan")])], [("a", "12")], [("a", [None])], [("a",)]):
        with pytest.raises(DataError):
            format_multislot(bad)


def test_parse_speed_sanity():
    """Not a benchmark: prints a rough throughput so regressions are visible in -s output."""
    rng = np.random.default_rng(0)
    data = ("\n".join(criteo_line(rng) for _ in range(3000)) + "\n").encode()
    CRITEO.parse(chunk(data))
    start = time.perf_counter()
    batch = CRITEO.parse(chunk(data))
    elapsed = time.perf_counter() - start
    assert batch.num_lines == 3000
    print(f"\nmultislot parse: {len(data) / elapsed / 1e6:.0f} MB/s, {3000 / elapsed:.0f} lines/s")
