"""What a new user sees after a mistake: one line naming the problem, exit 2, no traceback.

Covers ``aps.models.build_model`` (``--model-arg`` checked against the constructor),
``examples/word2vec/prepare_data.py --source DIR`` (which files it reads and which it skips) and
``examples/word2vec/eval.py`` (wrong paths and flags), plus the rule that progress bars appear
only when stderr is a terminal.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import aps.cli.trainer
from aps.errors import ConfigError
from aps.models import build_model
from aps.models.ctr_dnn.model import CtrDnn
from aps.models.word2vec.model import Word2Vec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "word2vec"

CORPUS = "".join(f"the king and the queen met a man and a woman in line {i}\n" for i in range(50))
ANALOGY = ": capital-common-countries\nathens greece baghdad iraq\n: family\nking queen man woman\n"


def load_example(name: str) -> ModuleType:
    """An examples/word2vec script as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"newcomer_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prepare_data() -> ModuleType:
    return load_example("prepare_data")


@pytest.fixture(scope="module")
def eval_script() -> ModuleType:
    return load_example("eval")


@pytest.fixture
def dict_path(tmp_path: Path) -> Path:
    path = tmp_path / "dict.txt"
    path.write_text("<UNK> 3\nking 2\nqueen 2\nman 1\nwoman 1\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- build_model


def test_unknown_model_argument_names_it_and_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        build_model("ctr_dnn", ["bogus=1"])
    message = str(err.value)
    assert message.startswith("unknown model argument 'bogus' for ctr_dnn; valid: embedding_size, hidden,")
    assert "\n" not in message


def test_a_typo_gets_a_suggestion_and_every_unknown_argument_is_named(dict_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'windw', 'foo' for word2vec \(did you mean 'window'\?\); valid: dict_path, dim, window"):
        build_model("word2vec", [f"dict_path={dict_path}", "windw=3", "foo=1"])


def test_bad_values_are_the_models_own_config_errors(dict_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^word2vec dim must be an integer, got 'abc'$"):
        build_model("word2vec", [f"dict_path={dict_path}", "dim=abc"])
    with pytest.raises(ConfigError, match=r"^ctr_dnn hidden must be comma-separated positive widths, got '400,x'$"):
        build_model("ctr_dnn", ["hidden=400,x"])


def test_good_arguments_build_the_model_with_those_values(dict_path: Path) -> None:
    model = build_model("word2vec", [f"dict_path={dict_path}", "dim=16", "negatives=pair"])
    assert isinstance(model, Word2Vec) and (model.dim, model.negatives, model.vocab_size) == (16, "pair", 5)
    net = build_model(CtrDnn, ["hidden=8,4", "optimizer=sgd"])  # a class works as well as a name
    assert isinstance(net, CtrDnn) and (net.hidden, net.optimizer) == ((8, 4), "sgd")
    later = build_model("ctr_dnn", ["batch_size=10", "batch_size=20"])  # the last value wins, as before
    assert later.batch_size == 20


class NeedsRows:
    """A user's model with a required argument and a constructor that checks nothing itself."""

    name = "needs_rows"

    def __init__(self, rows: int, scale: float = 1.0) -> None:
        self.rows = int(rows)
        self.scale = float(scale)


class TakesAnything:
    def __init__(self, **settings: object) -> None:
        self.settings = settings


class Buggy:
    def __init__(self, width: int = 3) -> None:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


class ReadsFile:
    name = "reads_file"

    def __init__(self, path: str = "vocab.txt") -> None:
        with open(path) as f:
            self.lines = f.readlines()


def test_a_file_the_constructor_cannot_open_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model reads_file: \[Errno 2\] No such file or directory: '.*/missing.txt'$"):
        build_model(ReadsFile, [f"path={tmp_path / 'missing.txt'}"])


def test_a_missing_required_argument_is_named() -> None:
    with pytest.raises(ConfigError, match=r"^model needs_rows needs --model-arg rows=\.\.\.; valid: rows, scale$"):
        build_model(NeedsRows, ["scale=2"])
    assert build_model(NeedsRows, ["rows=7"]).rows == 7


def test_a_constructors_type_or_value_error_becomes_a_config_error_naming_the_argument() -> None:
    with pytest.raises(ConfigError) as err:
        build_model(NeedsRows, ["rows=many"])
    assert str(err.value).startswith("model needs_rows rejected rows='many': ValueError: invalid literal for int()")
    assert isinstance(err.value.__cause__, ValueError)


def test_keyword_catch_alls_accept_anything_and_model_bugs_keep_their_traceback() -> None:
    assert build_model(TakesAnything, ["a=1", "b=x"]).settings == {"a": 1, "b": "x"}
    with pytest.raises(TypeError):  # no argument of the user's to blame: not turned into a ConfigError
        build_model(Buggy, [])


def test_model_argument_syntax_and_unknown_models_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="key=value, got 'lr'"):
        build_model("ctr_dnn", ["lr"])
    with pytest.raises(ConfigError, match="unknown model 'nope'"):
        build_model("nope", [])


# ---------------------------------------------------------------- through the real CLI

CLI_SWITCHED = "build_model" in vars(aps.cli.trainer)
needs_switched_cli = pytest.mark.skipif(not CLI_SWITCHED, reason="CLI not switched yet")


@needs_switched_cli
@pytest.mark.parametrize("model,arg,expected", [
    ("ctr_dnn", "bogus=1", "unknown model argument 'bogus' for ctr_dnn; valid: "),
    ("ctr_dnn", "hidden=400,x", "ctr_dnn hidden must be comma-separated positive widths, got '400,x'"),
    ("word2vec", "dim=abc", "word2vec dim must be an integer, got 'abc'"),
])
def test_trainer_cli_reports_a_bad_model_argument_in_one_line(
    model: str, arg: str, expected: str, dict_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    extra = ["--model-arg", f"dict_path={dict_path}"] if model == "word2vec" else []
    code = aps.cli.trainer.main(["--pservers", "127.0.0.1:1", "--model", model, *extra,
                                 "--model-arg", arg, "--data", "X"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("aps-trainer: error: ") and expected in err
    assert "Traceback" not in err


@needs_switched_cli
def test_bin_aps_trainer_exits_2_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "aps-trainer"), "--pservers", "127.0.0.1:1", "--model", "ctr_dnn",
         "--model-arg", "bogus=1", "--data", "X"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "'bogus'" in result.stderr and "embedding_size" in result.stderr


# ---------------------------------------------------------------- prepare_data.py --source DIR


def mixed_source(tmp_path: Path) -> Path:
    """A text file, an analogy file, a binary file and a Latin-1 file side by side."""
    src = tmp_path / "src"
    (src / "more").mkdir(parents=True)
    (src / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    (src / "more" / "extra.txt.gz").write_bytes(gzip.compress(CORPUS.encode()))
    (src / "questions-words.txt").write_text(ANALOGY, encoding="utf-8")
    (src / "vectors.bin").write_bytes(np.arange(4096, dtype=np.float32).tobytes())
    (src / "latin1.txt").write_bytes("caf\xe9 na\xefve\n".encode("latin-1"))
    return src


def test_prepare_skips_binary_and_analogy_files_and_says_what_it_reads(prepare_data: ModuleType, tmp_path: Path) -> None:
    src = mixed_source(tmp_path)
    lines: list[str] = []
    out = prepare_data.prepare(tmp_path / "out", str(src), min_count=1, num_files=2,
                               analogy=str(src / "questions-words.txt"), log=lines.append)
    notes = [ln.strip() for ln in lines if "skipping" in ln]
    assert notes == [
        "skipping latin1.txt: not UTF-8 text (byte 0xe9 at offset 3)",
        "skipping questions-words.txt: an analogy test set (': section' headers, 4-word lines), not corpus text",
        "skipping vectors.bin: binary content (NUL bytes in the first 8 KiB)",
    ]
    assert f"text: reading 2 files: corpus.txt, more/extra.txt.gz under {src}" in lines
    meta = json.loads((out / "meta.json").read_text())
    assert [f["name"] for f in meta["text_files"]] == ["corpus.txt", "extra.txt.gz"]
    words = {line.split()[0] for line in (out / "dict.txt").read_text().splitlines()}
    assert "athens" not in words and "king" in words  # the test set did not leak into training
    assert meta["total_tokens"] == 2 * 13 * 50


def test_glob_picks_the_files_and_the_output_inside_the_source_is_never_read(prepare_data: ModuleType, tmp_path: Path) -> None:
    src = mixed_source(tmp_path)
    lines: list[str] = []
    prepare_data.prepare(src / "prepared", str(src), min_count=1, num_files=1, glob="*.txt",
                         analogy=str(src / "questions-words.txt"), log=lines.append)
    assert f"text: reading 1 file: corpus.txt under {src}" in lines
    lines.clear()  # a rerun: the first run's output now lies under the source
    prepare_data.prepare(src / "prepared", str(src), min_count=1, num_files=1,
                         analogy=str(src / "questions-words.txt"), log=lines.append)
    assert any(ln.startswith("  skipping ") and "inside the output directory" in ln for ln in lines)
    assert f"text: reading 2 files: corpus.txt, more/extra.txt.gz under {src}" in lines


def test_an_earlier_output_directory_is_skipped_and_one_file_is_a_source(prepare_data: ModuleType, tmp_path: Path) -> None:
    src = mixed_source(tmp_path)
    prepare_data.prepare(src / "old", str(src / "corpus.txt"), min_count=1, num_files=1,
                         analogy=str(src / "questions-words.txt"), log=lambda line: None)
    lines: list[str] = []
    prepare_data.prepare(tmp_path / "new", str(src), min_count=1, num_files=1,
                         analogy=str(src / "questions-words.txt"), log=lines.append)
    assert any(ln.endswith(f"in {src / 'old'}: the output of an earlier prepare_data.py run") for ln in lines)
    assert f"text: reading 2 files: corpus.txt, more/extra.txt.gz under {src}" in lines


def test_a_cut_multibyte_character_at_the_sniff_limit_is_still_text(prepare_data: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "accents.txt"
    path.write_text("a" + "é" * 6000 + "\n", encoding="utf-8")  # byte 8192 falls inside an "é"
    assert prepare_data.not_corpus_text(path) is None
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"not gzip at all")
    assert prepare_data.not_corpus_text(bad).startswith("cannot be read")


@pytest.mark.parametrize("setup,args,expected", [
    ("binary-only", [], "no usable text file under {src} (2 files looked at, all skipped)"),
    ("mixed", ["--glob", "*.md"], "--glob '*.md' matches no file under {src}"),
    ("mixed", ["--glob", "*.bin"], "no usable text file matching '*.bin' under {src} (1 file looked at, all skipped)"),
    ("mixed", ["--min-count", "0"], "--min-count must be >= 1, got 0"),
    ("mixed", ["--analogy", "missing.txt"], "--analogy missing.txt: no such file"),
    ("mixed", ["--debian-sources", "austen"], "--debian-sources only applies to --source debian"),
    ("mixed", ["--min-count", "1000"], "no word occurs --min-count=1000 times or more in the 1,300 tokens read"),
])
def test_prepare_refuses_in_one_line_with_exit_2(prepare_data: ModuleType, tmp_path: Path, setup: str, args: list[str],
                                                 expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = mixed_source(tmp_path) if setup == "mixed" else tmp_path / "src"
    if setup == "binary-only":
        src.mkdir()
        (src / "a.bin").write_bytes(b"\0" * 100)
        (src / "questions-words.txt").write_text(ANALOGY, encoding="utf-8")
    analogy = [] if "--analogy" in args else ["--analogy", str(tmp_path / "q.txt")]
    (tmp_path / "q.txt").write_text(ANALOGY, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        prepare_data.main(["--source", str(src), "--out", str(tmp_path / "out"), *analogy, *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(f"prepare_data.py: error: {expected.format(src=src)}") and err.count("\n") == 1


def test_prepare_from_the_command_line_prints_no_progress_bar_when_not_on_a_terminal(
    prepare_data: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    src = mixed_source(tmp_path)
    prepare_data.main(["--source", str(src), "--out", str(tmp_path / "out"), "--min-count", "1", "--num-files", "2",
                       "--analogy", str(src / "questions-words.txt")])
    captured = capsys.readouterr()
    assert captured.err == ""  # no bar, no control characters in logs
    assert "text: reading 2 files" in captured.out and "\r" not in captured.out


# ---------------------------------------------------------------- eval.py


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A one-shard checkpoint of a 5-row ``emb`` table in which king - man + woman = queen."""
    from aps.checkpoints.shards import save_shard
    from aps.specs import SGD, Constant, SparseTable
    from aps.storage.tables import make_shard

    spec = SparseTable("emb", 5, 3, Constant(0.0), SGD(0.1))
    shard = make_shard(spec, 0, 1)
    vectors = np.array([[0, 0, 0], [1, 1, 0], [1, -1, 0], [0, 1, 1], [0, -1, 1]], np.float32)  # <UNK> king queen man woman
    shard.values[:] = vectors  # type: ignore[union-attr]
    save_shard(tmp_path / "ckpt", {"emb": shard}, 0, 1, {"global_step": 1})
    return tmp_path / "ckpt"


def test_eval_scores_and_shows_a_bar_only_on_a_terminal(eval_script: ModuleType, checkpoint: Path, dict_path: Path,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    questions = tmp_path / "q.txt"
    questions.write_text(": family\nking queen man woman\n", encoding="utf-8")
    args = ["--checkpoint", str(checkpoint), "--dict", str(dict_path), "--questions", str(questions)]
    assert eval_script.main(args) == 0
    captured = capsys.readouterr()
    assert "| family | 1 | 1 | 1 | 100.0% | 100.0% |" in captured.out and captured.err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert eval_script.main(args) == 0
    assert "analogies" in capsys.readouterr().err


@pytest.mark.parametrize("args,expected", [
    (["--dict", "{tmp}/missing.txt"], "--dict {tmp}/missing.txt: no such file (the dict.txt made by examples/word2vec/prepare_data.py)"),
    (["--dict", "{tmp}/short.txt"], "--dict {tmp}/short.txt has 2 words but table 'emb' has 5 rows: pass the dictionary the model was trained with"),
    (["--questions", "{ckpt}/shard-00000-of-00001/t0000-emb.values.npy"], "is not a UTF-8 text file"),
    (["--questions", "{tmp}"], "--questions {tmp}: is a directory, not a file"),
    (["--json", "{tmp}/no/such/dir/out.json"], "--json {tmp}/no/such/dir/out.json: directory {tmp}/no/such/dir does not exist"),
    (["--table", "emb_w"], "has no table 'emb_w' (has ['emb'])"),
])
def test_eval_refuses_in_one_line_with_exit_2(eval_script: ModuleType, checkpoint: Path, dict_path: Path, tmp_path: Path,
                                              args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "short.txt").write_text("<UNK> 1\nking 1\n", encoding="utf-8")
    (tmp_path / "q.txt").write_text(ANALOGY, encoding="utf-8")
    base = {"--checkpoint": str(checkpoint), "--dict": str(dict_path), "--questions": str(tmp_path / "q.txt")}
    given = [a.format(tmp=tmp_path, ckpt=checkpoint) for a in args]
    for flag, value in zip(given[::2], given[1::2]):
        base[flag] = value
    assert eval_script.main([x for kv in base.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eval.py: error: ") and err.count("\n") == 1
    assert expected.format(tmp=tmp_path, ckpt=checkpoint) in err


@pytest.mark.parametrize("args,expected", [
    (["--restrict-vocab", "0"], "argument --restrict-vocab: must be >= 1, got 0"),
    (["--binary"], "--binary only applies with --export PATH"),
])
def test_eval_flag_misuse_is_an_argparse_error(eval_script: ModuleType, checkpoint: Path, args: list[str], expected: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        eval_script.main(["--checkpoint", str(checkpoint), *args])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"eval.py: error: {expected}")


@pytest.mark.slow
@pytest.mark.parametrize("args,expected", [
    ([], "the following arguments are required: --model"),
    (["--", "--model", "ctr_dnn"], "one of the arguments --data --data-passes --data-stream is required"),
    (["--", "--model", "ctr_dnn", "--data", "x", "--epochs", "zz"], "argument --epochs: invalid int value: 'zz'"),
])
def test_aps_local_checks_trainer_options_before_starting_anything(tmp_path: Path, args: list[str], expected: str) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bin" / "aps-local"), "1x1", *args],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and expected in result.stderr
    assert not (tmp_path / "log" / "pserver.0.log").exists()  # no pserver was started


@pytest.mark.slow
@pytest.mark.parametrize("args,expected", [
    (["--host", "256.1.1.1", "--port", "0"], "host '256.1.1.1' does not resolve to an address here"),
    (["--trainers", "0"], "--trainers must be >= 1, got 0"),
    (["--port-file", "/nonexistent-dir/port"], "its directory does not exist"),
])
def test_aps_server_misuse_is_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bin" / "aps-server"), *args],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr
