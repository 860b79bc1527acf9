"""word2vec data preparation: dictionary, subsampling, id conversion, resplit, Debian readers.

Everything runs on small inputs built here (no network, no apt); the whole file takes seconds.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import struct
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "word2vec"))  # corpus preparation lives with the example
import preprocess as pp  # noqa: E402


@pytest.fixture(scope="module")
def debian_text():
    """The example module, loaded from its file (examples/ is not a package)."""
    path = ROOT / "examples" / "word2vec" / "debian_text.py"
    spec = importlib.util.spec_from_file_location("w2v_debian_text", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def write_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The cat sat on the mat.\nThe dog, the CAT!\n", encoding="utf-8")
    (corpus / "b.txt").write_text("Don't feed the dog 42 times\n\ncat café\n", encoding="utf-8")
    (corpus / ".hidden").write_text("ignored ignored ignored\n")
    return corpus


# ---------------------------------------------------------------- tokenising and the dictionary

def test_tokenize_lowercases_and_keeps_letter_runs_only() -> None:
    assert pp.tokenize("Don't STOP: 42 café_au-lait x2") == ["don", "t", "stop", "café", "au", "lait", "x"]


def test_dictionary_counts_are_exact_and_ordered(tmp_path: Path) -> None:
    d = pp.build_dictionary(write_corpus(tmp_path), min_count=2)
    # the: 5, cat: 3, dog: 2 kept; sat on mat don t feed times café: 1 each → <UNK>
    assert d.words == ("<UNK>", "the", "cat", "dog")
    assert d.counts.tolist() == [8, 5, 3, 2]
    assert d.total == 18 and len(d) == 4
    assert d.min_count == 2


def test_min_count_boundary_and_ties_by_word() -> None:
    tokens = ["b"] * 3 + ["a"] * 3 + ["c"] * 2 + ["d"]
    d = pp.build_dictionary(tokens, min_count=2)
    assert d.words == ("<UNK>", "a", "b", "c")  # count == min_count is kept; ties sorted by word
    assert d.counts.tolist() == [1, 3, 3, 2]
    d1 = pp.build_dictionary(tokens, min_count=1)
    assert d1.counts[pp.UNK_ID] == 0 and "d" in d1
    assert pp.build_dictionary([["x", "y"], ["x"]], min_count=2).words == ("<UNK>", "x")


def test_unk_mapping_and_encode() -> None:
    d = pp.build_dictionary(["a"] * 5 + ["b"] * 5 + ["rare"], min_count=5)
    assert d.encode(["b", "rare", "never", "a"]).tolist() == [2, 0, 0, 1]
    assert d.id_of("rare") == pp.UNK_ID and "rare" not in d and "<UNK>" not in d
    sentences, stats = pp.encode_text("a rare b\nnever\n", d)
    assert [s.tolist() for s in sentences] == [[1, 0, 2], [0]]
    assert (stats.lines_in, stats.tokens_in, stats.unk_in, stats.tokens_out) == (2, 4, 2, 4)
    sentences, stats = pp.encode_text("a rare b\nnever\n", d, drop_unk=True)
    assert [s.tolist() for s in sentences] == [[1, 2]] and stats.lines_out == 1


def test_dictionary_files_round_trip(tmp_path: Path) -> None:
    d = pp.build_dictionary(["x"] * 3 + ["y"] * 2 + ["z"], min_count=2)
    d.save(tmp_path / "dict.txt", tmp_path / "word_to_id.txt")
    assert (tmp_path / "dict.txt").read_text() == "<UNK> 1\nx 3\ny 2\n"
    assert (tmp_path / "word_to_id.txt").read_text() == "<UNK> 0\nx 1\ny 2\n"
    loaded = pp.Dictionary.load(tmp_path / "dict.txt")
    assert loaded.words == d.words and loaded.counts.tolist() == d.counts.tolist()
    (tmp_path / "bad.txt").write_text("<UNK> 1\nx three\n")
    with pytest.raises(DataError, match="bad.txt:2"):
        pp.Dictionary.load(tmp_path / "bad.txt")
    (tmp_path / "nounk.txt").write_text("x 3\n<UNK> 1\n")
    with pytest.raises(DataError, match="first line"):
        pp.Dictionary.load(tmp_path / "nounk.txt")
    with pytest.raises(ConfigError):
        pp.Dictionary(["<UNK>", "x", "x"], [0, 1, 1])


# ---------------------------------------------------------------- subsampling

def test_keep_probability_is_word2vecs_formula() -> None:
    counts = {"w0": 500_000, "w1": 50_000, "w2": 5_000, "w3": 500, "w4": 5}
    d = pp.Dictionary.from_counts(counts, min_count=1)
    keep = d.keep_probabilities(1e-3)
    t = 1e-3 * d.total
    for word, f in counts.items():
        expected = min(1.0, (np.sqrt(f / t) + 1) * t / f)
        assert keep[d.id_of(word)] == pytest.approx(expected)
    assert keep[pp.UNK_ID] == 1.0  # count 0: never divided by
    assert (d.keep_probabilities(0) == 1).all()


def test_downsampling_keep_rate_matches_formula_on_large_corpus() -> None:
    rng = np.random.default_rng(1)
    vocab = np.array([f"w{chr(97 + i)}" for i in range(8)])
    probs = np.array([0.4, 0.2, 0.15, 0.1, 0.08, 0.04, 0.02, 0.01])
    tokens = vocab[rng.choice(len(vocab), size=400_000, p=probs)]
    lines = [" ".join(tokens[i:i + 20]) for i in range(0, tokens.size, 20)]
    text = "\n".join(lines) + "\n"
    d = pp.build_dictionary(tokens.tolist(), min_count=1)
    keep = d.keep_probabilities(1e-2)
    sentences, stats = pp.encode_text(text, d, keep_prob=keep, rng=np.random.default_rng(7))
    kept = np.bincount(np.concatenate(sentences), minlength=len(d))
    for word_id in range(1, len(d)):
        n = int(d.counts[word_id])
        sigma = np.sqrt(keep[word_id] * (1 - keep[word_id]) / n)
        assert abs(kept[word_id] / n - keep[word_id]) < 5 * sigma + 1e-9
    assert keep[1] < 0.3  # the frequent word really is thinned
    assert stats.tokens_in == 400_000 and stats.tokens_out == kept.sum()


def test_subsampling_is_seeded_and_independent_of_block_boundaries() -> None:
    d = pp.build_dictionary(["a"] * 50 + ["b"] * 20 + ["c"] * 5, min_count=1)
    keep = d.keep_probabilities(0.05)
    text = "a b a c a\nb a a\nc a b a\n" * 50
    one, _ = pp.encode_text(text, d, keep_prob=keep, rng=np.random.default_rng(3))
    rng = np.random.default_rng(3)
    half = len(text) // 2
    cut = text.index("\n", half) + 1
    two = pp.encode_text(text[:cut], d, keep_prob=keep, rng=rng)[0] + pp.encode_text(text[cut:], d, keep_prob=keep, rng=rng)[0]
    assert pp.format_id_lines(one) == pp.format_id_lines(two)
    again, _ = pp.encode_text(text, d, keep_prob=keep, rng=np.random.default_rng(3))
    assert pp.format_id_lines(one) == pp.format_id_lines(again)
    with pytest.raises(ConfigError):
        pp.encode_text(text, d, keep_prob=keep)


def test_long_lines_are_cut_and_empty_lines_dropped() -> None:
    d = pp.build_dictionary(["a", "b"], min_count=1)
    sentences, stats = pp.encode_text("a b a b a\n\n...\nb\n", d, max_sentence_len=2)
    assert [s.tolist() for s in sentences] == [[1, 2], [1, 2], [1], [2]]
    assert (stats.lines_in, stats.lines_out) == (4, 4)


def test_convert_corpus_writes_one_id_file_per_input(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    d = pp.build_dictionary(corpus, min_count=2)
    files = pp.list_text_files(corpus)
    assert [f.name for f in files] == ["a.txt", "b.txt"]
    stats = pp.convert_corpus(files, tmp_path / "ids", d, sample=0)
    assert sorted(p.name for p in (tmp_path / "ids").iterdir()) == ["00000_a.txt", "00001_b.txt"]
    assert (tmp_path / "ids" / "00000_a.txt").read_text() == "1 2 0 0 1 0\n1 3 1 2\n"
    assert (tmp_path / "ids" / "00001_b.txt").read_text() == "0 0 0 1 3 0\n2 0\n"
    assert (stats.tokens_in, stats.tokens_out, stats.lines_in, stats.lines_out) == (18, 18, 5, 4)


# ---------------------------------------------------------------- resplit

def make_id_files(directory: Path, seed: int = 0, files: int = 3, lines: int = 400) -> bytes:
    rng = np.random.default_rng(seed)
    directory.mkdir()
    joined = b""
    for i in range(files):
        text = "".join(" ".join(map(str, rng.integers(0, 1000, rng.integers(1, 40)))) + "\n" for _ in range(lines))
        (directory / f"{i:05d}_x").write_bytes(text.encode())
        joined += text.encode()
    return joined


@pytest.mark.parametrize("balance", ["lines", "tokens"])
def test_resplit_is_balanced_and_loses_nothing(tmp_path: Path, balance: str) -> None:
    joined = make_id_files(tmp_path / "in")
    out = pp.resplit(tmp_path / "in", tmp_path / "out", 16, balance=balance)
    assert [f.path.name for f in out] == [f"part-{j:05d}" for j in range(16)]
    data = [f.path.read_bytes() for f in out]
    assert b"".join(data) == joined
    lines = [d.count(b"\n") for d in data]
    tokens = [len(d.split()) for d in data]
    assert [f.lines for f in out] == lines and [f.tokens for f in out] == tokens
    assert [f.bytes for f in out] == [len(d) for d in data]
    if balance == "lines":
        assert max(lines) - min(lines) <= 1
    else:
        longest = max(len(line.split()) for line in joined.splitlines())
        assert max(abs(t - sum(tokens) / 16) for t in tokens) <= longest


def test_resplit_shuffle_keeps_every_line_and_replaces_stale_parts(tmp_path: Path) -> None:
    joined = make_id_files(tmp_path / "in", seed=5)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part-00099").write_text("stale\n")
    out = pp.resplit(tmp_path / "in", tmp_path / "out", 4, shuffle=True, seed=11)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"part-{j:05d}" for j in range(4)]
    data = b"".join(f.path.read_bytes() for f in out)
    assert Counter(data.splitlines()) == Counter(joined.splitlines())
    assert data != joined  # really shuffled
    longest = max(len(line.split()) for line in joined.splitlines())
    assert max(f.tokens for f in out) - min(f.tokens for f in out) <= 2 * longest
    again = pp.resplit(tmp_path / "in", tmp_path / "again", 4, shuffle=True, seed=11)
    assert [f.path.read_bytes() for f in again] == [f.path.read_bytes() for f in out]


def test_resplit_more_files_than_lines_and_missing_final_newline(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x").write_bytes(b"1 2\n3")
    out = pp.resplit(tmp_path / "in", tmp_path / "out", 4, balance="lines")
    assert b"".join(f.path.read_bytes() for f in out) == b"1 2\n3\n"
    assert sorted(f.lines for f in out) == [0, 0, 1, 1]
    with pytest.raises(ConfigError):
        pp.resplit(tmp_path / "in", tmp_path / "out", 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=200), st.integers(1, 20))
def test_cut_points_deviate_less_than_the_largest_weight(weights: list[int], parts: int) -> None:
    w = np.array(weights, dtype=np.int64)
    bounds = pp.cut_points(w, parts)
    assert bounds[0] == 0 and bounds[-1] == w.size and (np.diff(bounds) >= 0).all()
    sums = np.add.reduceat(np.append(w, 0), bounds[:-1]) * (np.diff(bounds) > 0)
    if w.sum():
        assert np.abs(sums - w.sum() / parts).max() <= w.max()


# ---------------------------------------------------------------- Debian format readers

def _i(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def _chars(s: str | None, latin1: bool = False) -> bytes:
    if s is None:
        return _i(9, -1)
    raw = s.encode("latin-1" if latin1 else "utf-8")
    return _i(9 | ((4 if latin1 else 8) << 12), len(raw)) + raw


def _strs(*items: str | None) -> bytes:
    return _i(16, len(items)) + b"".join(_chars(s) for s in items)


def _names_attr(names: list[str], symbol_ref: int | None) -> bytes:
    """Pairlist ``names = c(...)``; the symbol is written once, then referred to (REFSXP)."""
    symbol = _i((symbol_ref << 8) | 255) if symbol_ref else _i(1) + _chars("names")
    return _i(2 | 1 << 10) + symbol + _strs(*names) + _i(254)


def _serialize(body: bytes) -> bytes:
    return b"X\n" + _i(3, 0x040201, 0x030500, 5) + b"UTF-8" + body


def test_r_unserialize_reads_strings_lists_names_and_refs(debian_text) -> None:
    body = (_i(19 | 1 << 9, 3) + _strs("It is a truth", None, "")
            + _i(19 | 1 << 9, 1) + _i(13, 2, 7, -9) + _names_attr(["inner"], None)
            + _i(16, 1) + _chars("café", latin1=True)
            + _names_attr(["text", "nested", "latin"], 1))
    obj = debian_text.r_unserialize(_serialize(body))
    assert obj.type == debian_text.VECSXP and obj.names() == ["text", "nested", "latin"]
    text, nested, latin = obj.value
    assert text.value == ["It is a truth", None, ""]
    assert nested.names() == ["inner"] and nested.value[0].value.tolist() == [7, -9]
    assert latin.value == ["café"]
    with pytest.raises(ValueError, match="not an XDR"):
        debian_text.r_unserialize(b"A\n" + body)


def test_rdb_chunks_and_lazyload_index(debian_text, tmp_path: Path) -> None:
    emma = _serialize(_strs("EMMA", "", "Emma Woodhouse, handsome, clever, and rich,"))
    persuasion = _serialize(_strs("Persuasion"))
    chunk1 = struct.pack(">I", len(emma)) + zlib.compress(emma)
    chunk2 = struct.pack(">I", len(persuasion)) + zlib.compress(persuasion)
    rdb = b"junk" + chunk1 + chunk2
    assert debian_text.read_rdb_chunk(rdb, 4, len(chunk1)) == emma
    bz = struct.pack(">I", len(emma)) + b"2" + bz2.compress(emma)
    assert debian_text.read_rdb_chunk(bz, 0, len(bz), compression=2) == emma
    with pytest.raises(ValueError, match="header says"):
        debian_text.read_rdb_chunk(struct.pack(">I", 3) + zlib.compress(emma), 0, 100)
    variables = (_i(19 | 1 << 9, 2) + _i(13, 2, 4, len(chunk1)) + _i(13, 2, 4 + len(chunk1), len(chunk2))
                 + _names_attr(["emma", "persuasion"], None))
    index = (_i(19 | 1 << 9, 3) + variables + _i(19, 0) + _i(10, 1, 1)
             + _names_attr(["variables", "references", "compressed"], 1))
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(_serialize(index)))
    (tmp_path / "Rdata.rdb").write_bytes(rdb)
    db = debian_text.read_lazyload_db(tmp_path / "Rdata.rdx", tmp_path / "Rdata.rdb")
    assert list(db) == ["emma", "persuasion"]
    assert db["emma"].value[2] == "Emma Woodhouse, handsome, clever, and rich,"
    assert db["persuasion"].value == ["Persuasion"]


def test_ztext_blocks_entries_and_osis_markup(debian_text) -> None:
    block0 = b'<title type="main">Genesis</title><w lemma="H1">In</w> <w lemma="H2">the</w> beginning'
    block1 = ('God<note placement="foot"><reference>1:1</reference>“Elohim”</note><w>created</w> '
              'light &amp; <hi type="italic">dark</hi>ness.').encode()
    c0, c1 = zlib.compress(block0), zlib.compress(block1)
    bzz = c0 + c1
    bzs = struct.pack("<III", 0, len(c0), len(block0)) + struct.pack("<III", len(c0), len(c1), len(block1))
    assert debian_text.read_ztext_blocks(bzs, bzz) == [block0, block1]
    bzv = (struct.pack("<IIH", 0, 0, 0) + struct.pack("<IIH", 0, 0, len(block0))
           + struct.pack("<IIH", 1, 0, len(block1)))
    verses = list(debian_text.read_ztext_entries(bzs, bzz, bzv))
    assert len(verses) == 2
    assert [debian_text.osis_to_text(v) for v in verses] == [
        "Genesis In the beginning", "God created light & darkness."]
    bad = struct.pack("<III", 0, len(c0), 999)
    with pytest.raises(ValueError, match="index says"):
        debian_text.read_ztext_blocks(bad, bzz)


def test_text_cleaners(debian_text) -> None:
    rst = ("Title\n=====\n\nSome *prose* with :func:`len` and\na second line::\n\n    code = 1\n"
           "    more_code()\n\nAfter.\n\n.. note::\n\n   hidden directive body\n\n>>> 1 + 1\nEnd.\n")
    assert list(debian_text.rst_to_paragraphs(rst)) == [
        "Title", "Some *prose* with `len` and a second line", "After.", "End."]
    fortunes = "First one\n  continued\n%\n%\nSecond\n%\n"
    assert list(debian_text.fortunes_to_paragraphs(fortunes)) == ["First one continued", "Second"]
    gcide = 'Abuse \\A*buse"\\, v. t. To misuse.\n      [1913 Webster]\n\nNext entry.\n'
    assert pp.tokenize(" ".join(debian_text.gcide_to_paragraphs(gcide))) == [
        "abuse", "v", "t", "to", "misuse", "next", "entry"]
    dep5 = "Format: https://x\nUpstream-Name: y\n\nFiles: *\nCopyright: me\nLicense: MIT\n text\n\nFiles: debian/*\nLicense: GPL-2+\n"
    assert debian_text.licence_from_copyright(dep5) == "MIT"
    assert debian_text.licence_from_copyright("This package was debianized by ...") is None
