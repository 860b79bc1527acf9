"""Prepare word2vec training data: text → dictionary → subsampled id files → analogy set.

The steps of the reference's ``preprocess.py`` (``--build_dict``, ``--filter_corpus`` with
``--downsample``, ``--data_resplit``) in one command, plus getting a corpus and the analogy test
set. Every step is skipped when its outputs exist and were made with the same settings, so a
rerun is instant; ``--force`` redoes everything. Layout of ``OUT`` (default ``data/word2vec``)::

    text/                 the corpus as plain text (debian: <source>.txt, SOURCES.md, copyright/)
    dict.txt              "word count", one line per id; line 1 is <UNK> (id 0), then by count
    word_to_id.txt        "word id"
    train/part-00000 ...  one sentence of space-separated ids per line, balanced by tokens
    questions-words.txt   the analogy test set (19,544 questions in 14 sections)
    meta.json             sizes, token counts, per-file counts, settings, timings
    cache/                downloaded .deb files or tarball

From Python: ``prepare("data/word2vec", source="debian")`` returns the output directory.

With ``--source DIR`` every regular file below DIR is read as corpus text, except files that are
clearly something else: binary content (NUL bytes in the first 8 KiB, or not UTF-8) and the
analogy test set's shape (``: section`` header lines); each skipped file gets a one-line note.
``--glob PATTERN`` picks the files explicitly (e.g. ``--glob '*.txt'``). Progress bars appear on
stderr only when it is a terminal, so logs and tests stay clean.
"""

from __future__ import annotations

import argparse
import codecs
import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:  # imported from elsewhere: debian_text sits next to this file
    sys.path.insert(0, str(_HERE))

import debian_text  # noqa: E402  (after the path fix above)

from aps.errors import ConfigError, DataError  # noqa: E402  (debian_text made aps importable)
import preprocess as pp  # noqa: E402

ANALOGY_MEMBER = "gensim/test/test_data/questions-words.txt"
ONE_BILLION_DIR = "training-monolingual.tokenized.shuffled/"
ONE_BILLION_URL = ("http://www.statmt.org/lm-benchmark/"
                   "1-billion-word-language-modeling-benchmark-r13output.tar.gz")
#: how much of each file is looked at to decide whether it is corpus text
SNIFF_BYTES = 8192
#: file names listed when saying which files are read
SHOW_FILES = 5


class PrepareError(RuntimeError):
    """A corpus or the analogy set could not be obtained; the message says what to do instead."""


def _bar(**kwargs: Any) -> tqdm:
    """A progress bar on stderr, shown only when a person is watching (stderr is a terminal)."""
    return tqdm(disable=not sys.stderr.isatty(), leave=False, dynamic_ncols=True, **kwargs)


def not_corpus_text(path: Path) -> str | None:
    """Why ``path`` is clearly not corpus text, or None when it may be.

    Only the first :data:`SNIFF_BYTES` (decompressed for ``.gz``) are read, so checking a large
    corpus costs nothing. A binary file would be read as a stream of U+FFFD "words", and an
    analogy file (``questions-words.txt`` left next to the corpus) would leak the test set into
    training: both look like text to the reader, so they are caught here instead.
    """
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                head = f.read(SNIFF_BYTES)
        else:
            with open(path, "rb") as f:
                head = f.read(SNIFF_BYTES)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        return f"cannot be read ({exc})"
    if b"\0" in head:
        return f"binary content (NUL bytes in the first {SNIFF_BYTES // 1024} KiB)"
    try:  # incremental: the sample may end inside a multi-byte character
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < SNIFF_BYTES)
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte 0x{head[exc.start]:02x} at offset {exc.start})"
    lines = text.splitlines()
    if len(head) == SNIFF_BYTES and lines:
        lines = lines[:-1]  # the last line may be cut by the sample
    headers = [ln for ln in lines if ln.startswith(": ") and len(ln.split()) == 2]
    others = [ln for ln in lines if ln.strip() and ln not in headers]
    if headers and all(len(ln.split()) == 4 for ln in others):
        return "an analogy test set (': section' headers, 4-word lines), not corpus text"
    return None


def pick_text_files(directory: Path, pattern: str | None, exclude: Path | None,
                    log: Callable[[str], None]) -> list[Path]:
    """The files under ``directory`` to read as corpus text: every non-hidden file, or those
    matching ``pattern``; files under ``exclude`` (the output directory) and files that are
    clearly not text (:func:`not_corpus_text`) are left out, each with a one-line note."""
    if pattern is None:
        candidates = pp.list_text_files(directory)
    else:
        candidates = sorted(p for p in directory.glob(pattern) if p.is_file()
                            and not any(part.startswith(".") for part in p.relative_to(directory).parts))
        if not candidates:
            raise ConfigError(f"--glob {pattern!r} matches no file under {directory}")
    looked_at = len(candidates)
    if exclude is not None:  # --out inside --source: never read our own dict.txt and train/ as text
        ours = [p for p in candidates if p.resolve().is_relative_to(exclude)]
        if ours:
            log(f"  skipping {_files(len(ours))} inside the output directory {exclude}")
            candidates = [p for p in candidates if p not in ours]
    earlier: dict[Path, int] = {}  # an earlier run's output (its dict.txt, meta.json, train/) is not corpus text
    for p in candidates:
        if (found := _prepared_dir(p.parent, directory)) is not None:
            earlier[found] = earlier.get(found, 0) + 1
    for found, count in earlier.items():
        log(f"  skipping {_files(count)} in {found}: the output of an earlier prepare_data.py run")
    candidates = [p for p in candidates if _prepared_dir(p.parent, directory) is None]
    files = []
    for path in _bar(iterable=candidates, desc="checking files", unit="file"):
        shown = path.relative_to(directory)
        if (reason := not_corpus_text(path)) is not None:
            log(f"  skipping {shown}: {reason}")
            continue
        files.append(path)
    if not files:
        what = f"matching {pattern!r} " if pattern else ""
        raise ConfigError(f"no usable text file {what}under {directory} ({_files(looked_at)} looked at, all skipped)")
    return files


def _files(n: int) -> str:
    return f"{n} file{'s' if n != 1 else ''}"


def _prepared_dir(start: Path, root: Path) -> Path | None:
    """The directory from ``start`` up to ``root`` that holds a prepare_data.py output, if any."""
    for d in (start, *start.parents):
        if (d / "meta.json").is_file() and (d / "dict.txt").is_file() and (d / "train").is_dir():
            return d
        if d == root or not d.is_relative_to(root):
            return None
    return None


def describe_files(files: list[Path], root: Path) -> str:
    """``3 files: a.txt, b.txt, c.txt`` with at most :data:`SHOW_FILES` names."""
    names = [str(f.relative_to(root)) if f.is_relative_to(root) else f.name for f in files[:SHOW_FILES]]
    more = f", ... ({len(files) - SHOW_FILES} more)" if len(files) > SHOW_FILES else ""
    return f"{_files(len(files))}: {', '.join(names)}{more}"


def download(url: str, cache_dir: Path, log: Callable[[str], None]) -> Path:
    """Fetch ``url`` into ``cache_dir`` (kept for reruns), via a ``.part`` file so a cut transfer is never used."""
    target = cache_dir / (Path(urllib.parse.urlparse(url).path).name or "download")
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(part, "wb") as f:
            size, done, shown = int(response.headers.get("Content-Length") or 0), 0, -1
            bar = _bar(total=size or None, desc=target.name, unit="B", unit_scale=True)
            while chunk := response.read(1 << 20):
                f.write(chunk)
                done += len(chunk)
                bar.update(len(chunk))
                if bar.disable and size and (pct := 100 * done // size) // 5 != shown:
                    shown = pct // 5
                    log(f"  {target.name}: {pct}% of {size / 1e6:,.0f} MB")
            bar.close()
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        part.unlink(missing_ok=True)
        raise PrepareError(f"cannot download {url} ({exc}); fetch it another way and pass --source PATH") from exc
    part.replace(target)
    return target


def extract_one_billion(tarball: Path, text_dir: Path, log: Callable[[str], None]) -> list[Path]:
    """Copy the training files (``training-monolingual.tokenized.shuffled/*``) out of the tarball.

    Streams the archive once (``.tar`` or ``.tar.gz``); a hidden ``.complete`` marker says the
    extraction finished, so an interrupted one is redone rather than trusted.
    """
    marker = text_dir / ".complete"
    if not marker.exists():
        text_dir.mkdir(parents=True, exist_ok=True)
        count = 0
        with tarfile.open(tarball, "r|*") as tar, _bar(desc="extracting", unit="file") as bar:
            for member in tar:
                if member.isfile() and ONE_BILLION_DIR in member.name:
                    src = tar.extractfile(member)
                    with src, open(text_dir / Path(member.name).name, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    count += 1
                    bar.update(1)
                    if count % 10 == 0 and bar.disable:
                        log(f"  extracted {count} files")
        if count == 0:
            raise PrepareError(f"{tarball} has no {ONE_BILLION_DIR} files: is it the 1B-word benchmark?")
        marker.touch()
    return pp.list_text_files(text_dir)


def corpus_files(source: str, out: Path, force: bool, debian_sources: list[str] | None,
                 log: Callable[[str], None], glob: str | None = None) -> tuple[list[Path], dict[str, Any]]:
    """The text files to train on, and a description of where they came from for meta.json."""
    path = Path(source).expanduser()
    if glob is not None and not path.is_dir():
        raise ConfigError(f"--glob picks files of a --source directory; {source!r} is not one")
    if source == "debian":
        text_dir = out / "text"
        if force and text_dir.exists():
            shutil.rmtree(text_dir)
        log(f"text: Debian packages → {text_dir}")
        results = debian_text.fetch_debian_text(text_dir, out / "cache" / "debian", debian_sources, force, log)
        return [text_dir / r.file for r in results], {
            "kind": "debian", "sources": [asdict(r) for r in results], "notes": str(text_dir / "SOURCES.md")}
    if source.startswith(("http://", "https://")):
        log(f"text: downloading {source}")
        tarball = download(source, out / "cache", log)
        return extract_one_billion(tarball, out / "text", log), {"kind": "1b-words", "url": source}
    if path.is_dir():
        if not pp.list_text_files(path):
            raise ConfigError(f"--source {path} holds no files (hidden ones are not read)")
        files = pick_text_files(path, glob, out.resolve(), log)
        log(f"text: reading {describe_files(files, path)} under {path}")
        meta: dict[str, Any] = {"kind": "directory", "path": str(path.resolve())}
        if glob is not None:
            meta["glob"] = glob
        return files, meta
    if path.is_file() and path.name.endswith((".tar", ".tar.gz", ".tgz")):
        log(f"text: extracting {path}")
        if force and (out / "text").exists():
            shutil.rmtree(out / "text")
        return extract_one_billion(path, out / "text", log), {"kind": "1b-words", "path": str(path.resolve())}
    if path.is_file():
        if (reason := not_corpus_text(path)) is not None:
            raise ConfigError(f"--source {path} is not corpus text: {reason}")
        log(f"text: reading 1 file: {path}")
        return [path], {"kind": "file", "path": str(path.resolve())}
    raise ConfigError(f"--source {source!r} does not exist: give 'debian', a directory or file of text, "
                      "a .tar(.gz) file or a URL")


def find_analogy(target: Path, analogy: str | None, log: Callable[[str], None]) -> None:
    """Copy questions-words.txt: from ``analogy``, the installed gensim, or gensim's wheel on PyPI.

    gensim ships the set as test data; ``pip download`` of its wheel (no dependencies, nothing
    installed) is the fallback when gensim is not importable here.
    """
    if analogy:
        if not Path(analogy).is_file():
            raise ConfigError(f"--analogy {analogy}: no such file")
        shutil.copyfile(analogy, target)
        return
    spec = importlib.util.find_spec("gensim")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "test" / "test_data" / "questions-words.txt"
        if candidate.is_file():
            shutil.copyfile(candidate, target)
            return
    log("analogy: gensim not installed, taking questions-words.txt from its wheel (pip download)")
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run([sys.executable, "-m", "pip", "download", "gensim", "--no-deps",
                                 "--only-binary=:all:", "-q", "-d", tmp], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("gensim-*.whl"))
        if result.returncode != 0 or not wheels:
            raise PrepareError(f"cannot get gensim's wheel ({result.stderr.strip()[-300:]}); pass --analogy PATH")
        with zipfile.ZipFile(wheels[-1]) as wheel:
            target.write_bytes(wheel.read(ANALOGY_MEMBER))


def analogy_questions(path: Path) -> list[list[str]]:
    """The ``a b c d`` lines of an analogy file, lower-cased; ConfigError when it has none, so a
    wrong ``--analogy`` is refused before any work rather than reported as 0% coverage."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"analogy file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read analogy file {path}: {exc.strerror or exc}") from None
    found = [words for line in text.splitlines()
             if len(words := line.lower().split()) == 4 and not line.startswith(":")]
    if not found:
        raise ConfigError(f"{path} holds no 'a b c d' analogy questions: is it questions-words.txt?")
    return found


def analogy_coverage(path: Path, dictionary: pp.Dictionary) -> dict[str, int]:
    """How many analogy questions have all four (lower-cased) words in the vocabulary."""
    questions = analogy_questions(path)
    covered = sum(all(w in dictionary for w in words) for words in questions)
    return {"questions": len(questions), "in_vocab": covered}


def count_corpus(files: list[Path], min_count: int) -> pp.Dictionary:
    """:func:`pp.build_dictionary` on ``files``, file by file and chunk by chunk so that a progress
    bar can follow the bytes read (the counts are the same: same chunks, same tokenizer)."""
    counter: Counter[str] = Counter()
    with _bar(total=sum(f.stat().st_size for f in files), desc="counting words", unit="B", unit_scale=True) as bar:
        for path in files:
            gz = path.suffix == ".gz"
            for chunk in pp.iter_text_chunks(path):
                counter.update(pp.tokenize(chunk))
                if not gz and not bar.disable:
                    bar.update(len(chunk.encode("utf-8", "replace")))
            if gz:  # decompressed sizes are unknown: count the file when done
                bar.update(path.stat().st_size)
    return pp.Dictionary.from_counts(counter, min_count)


def check_settings(*, min_count: int, sample: float, num_files: int) -> None:
    """One ConfigError per bad number, naming the flag (checked before any work starts)."""
    if num_files < 1:
        raise ConfigError(f"--num-files must be >= 1, got {num_files}")
    if min_count < 1:
        raise ConfigError(f"--min-count must be >= 1, got {min_count}")
    if not 0 <= sample < float("inf"):
        raise ConfigError(f"--sample must be >= 0 (0 keeps every token), got {sample}")


def prepare(out_dir: str | Path = "data/word2vec", source: str = "debian", *, min_count: int = 5,
            sample: float = 1e-3, num_files: int = 16, seed: int = 0, shuffle: bool = True,
            analogy: str | None = None, debian_sources: list[str] | None = None, force: bool = False,
            log: Callable[[str], None] = print, glob: str | None = None) -> Path:
    """Run every step into ``out_dir`` and return it; see the module docstring for the layout."""
    check_settings(min_count=min_count, sample=sample, num_files=num_files)
    if debian_sources is not None:
        if source != "debian":
            raise ConfigError("--debian-sources only applies to --source debian")
        if debian_sources == ["second"]:
            debian_sources = list(debian_text.SECOND_CORPUS)
        known = [s.name for s in debian_text.SOURCES]
        if unknown := [n for n in debian_sources if n not in known]:
            raise ConfigError(f"unknown --debian-sources {', '.join(unknown)}; known: {', '.join(known)}")
    if analogy is not None:
        if not Path(analogy).is_file():
            raise ConfigError(f"--analogy {analogy}: no such file")
        analogy_questions(Path(analogy))
    started = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    old = {} if force or not meta_path.exists() else json.loads(meta_path.read_text())
    meta: dict[str, Any] = {"format": 1, "seconds": {}}

    def step_done(name: str, t0: float) -> None:
        meta["seconds"][name] = round(time.perf_counter() - t0, 2)
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")

    t0 = time.perf_counter()
    files, meta["source"] = corpus_files(source, out, force, debian_sources, log, glob)
    meta["text_files"] = [{"name": f.name, "bytes": f.stat().st_size} for f in files]
    step_done("text", t0)

    t0 = time.perf_counter()
    dict_params = {"source": meta["source"].get("path", meta["source"].get("url", "debian")),
                   "text_files": meta["text_files"], "min_count": min_count}
    dict_files = (out / "dict.txt", out / "word_to_id.txt")
    rebuilt = not (all(p.exists() for p in dict_files) and old.get("dict_params") == dict_params)
    if rebuilt:
        log(f"dict: counting words (min_count={min_count})")
        dictionary = count_corpus(files, min_count)
        dictionary.save(*dict_files)
    else:
        dictionary = pp.Dictionary.load(dict_files[0])
        dictionary.min_count = min_count
    if len(dictionary) < 2:  # only <UNK>: the word2vec model refuses such a dictionary later, say it now
        raise ConfigError(f"no word occurs --min-count={min_count} times or more in the {dictionary.total:,} "
                          "tokens read: give more text or a lower --min-count")
    meta.update(dict_params=dict_params, vocab_size=len(dictionary), min_count=min_count,
                unk_count=int(dictionary.counts[pp.UNK_ID]), total_tokens=dictionary.total)
    log(f"dict: {len(dictionary):,} ids (<UNK> = id 0 holds {meta['unk_count']:,} tokens), "
        f"{dictionary.total:,} tokens{'' if rebuilt else ' (cached)'}")
    step_done("dict", t0)

    t0 = time.perf_counter()
    train_params = {"sample": sample, "seed": seed, "num_files": num_files, "shuffle": shuffle,
                    "max_sentence_len": pp.MAX_SENTENCE_LEN}
    train_dir = out / "train"
    if rebuilt or old.get("train_params") != train_params or not train_dir.is_dir():
        ids_tmp, train_tmp = out / ".ids.tmp", out / ".train.tmp"
        for d in (ids_tmp, train_tmp):
            shutil.rmtree(d, ignore_errors=True)
        log(f"ids: subsampling with sample={sample}, seed={seed}")
        with _bar(total=sum(f.stat().st_size for f in files), desc="writing ids", unit="B", unit_scale=True) as bar:
            def converted(f: Path, s: pp.ConvertStats) -> None:  # once per input file
                bar.update(f.stat().st_size)
                log(f"  {f.name:<28} {s.tokens_in:>12,} → {s.tokens_out:>11,} tokens in {s.lines_out:,} lines")

            stats = pp.convert_corpus(files, ids_tmp, dictionary, sample=sample, seed=seed, progress=converted)
        log(f"train: {'shuffling and ' if shuffle else ''}splitting into {num_files} files")
        split = pp.resplit(ids_tmp, train_tmp, num_files, balance="tokens", shuffle=shuffle, seed=seed)
        shutil.rmtree(train_dir, ignore_errors=True)
        train_tmp.replace(train_dir)
        shutil.rmtree(ids_tmp)
        meta.update(tokens_after_downsampling=stats.tokens_out, lines_in=stats.lines_in, lines=stats.lines_out,
                    files=[{"name": f.path.name, "lines": f.lines, "tokens": f.tokens, "bytes": f.bytes} for f in split])
    else:
        meta.update({k: old[k] for k in ("tokens_after_downsampling", "lines_in", "lines", "files")})
    meta["train_params"] = train_params
    sizes = [f["tokens"] for f in meta["files"]]
    log(f"train: {meta['tokens_after_downsampling']:,} tokens in {meta['lines']:,} lines → {num_files} files "
        f"of {min(sizes):,}..{max(sizes):,} tokens in {train_dir}")
    step_done("train", t0)

    t0 = time.perf_counter()
    questions = out / "questions-words.txt"
    if force or not questions.exists() or analogy:
        find_analogy(questions, analogy, log)
    meta["analogy"] = {"file": questions.name, **analogy_coverage(questions, dictionary)}
    log(f"analogy: {meta['analogy']['in_vocab']:,} of {meta['analogy']['questions']:,} questions "
        "have all four words in the vocabulary")
    step_done("analogy", t0)
    meta["seconds"]["total"] = round(time.perf_counter() - started, 2)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=Path(__file__).name,  # the same name in messages however the script is started
        description="Prepare word2vec data like PaddlePaddle's example: build the dictionary, convert\n"
                    "text to ids with word2vec subsampling, resplit into balanced files, fetch the analogy\n"
                    "test set. Steps whose outputs exist with the same settings are skipped.",
        epilog="examples:  %(prog)s                      # Debian text into data/word2vec, 16 files\n"
               "           %(prog)s --source ~/corpus    # any directory of text files\n"
               "           %(prog)s --source ~/corpus --glob '*.txt'   # only those files\n"
               "           %(prog)s --source 1b.tar.gz --num-files 1024 --out data/1b",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="debian",
                        help="'debian' (free English text from Debian packages; the default), a directory of "
                             "text files (binary and analogy-set files in it are skipped), one text file, "
                             "or a path or URL of the 1B-word benchmark tarball (" + ONE_BILLION_URL + ")")
    parser.add_argument("--glob", metavar="PATTERN",
                        help="with --source DIR: read only the files matching PATTERN under DIR "
                             "(e.g. '*.txt' or '**/*.txt'; quote it so the shell leaves it alone)")
    parser.add_argument("--out", default="data/word2vec", help="output directory (default: %(default)s)")
    parser.add_argument("--min-count", type=int, default=5, help="rarer words become <UNK>, id 0 (default: %(default)s)")
    parser.add_argument("--sample", type=float, default=1e-3,
                        help="subsampling threshold, 0 keeps every token (default: %(default)s)")
    parser.add_argument("--num-files", type=int, default=16,
                        help="training files; use a multiple of trainers x workers (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of subsampling and shuffling (default: %(default)s)")
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                        help="keep corpus order: files become contiguous runs of lines (default: shuffle)")
    parser.add_argument("--analogy", metavar="PATH", help="questions-words.txt to use instead of gensim's copy")
    parser.add_argument("--debian-sources", metavar="NAMES", help="comma-separated subset of: "
                        + ", ".join(s.name for s in debian_text.SOURCES) + "; default: the default corpus (austen .. linux_doc); "
                        "'second': the second corpus, only packages the default one does not use ("
                        + ",".join(debian_text.SECOND_CORPUS) + ")")
    parser.add_argument("--force", action="store_true", help="redo every step, re-extracting the text")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        out = prepare(args.out, args.source, min_count=args.min_count, sample=args.sample,
                      num_files=args.num_files, seed=args.seed, shuffle=args.shuffle, analogy=args.analogy,
                      debian_sources=args.debian_sources.split(",") if args.debian_sources else None,
                      force=args.force, log=tqdm.write, glob=args.glob)
    except ConfigError as exc:  # the command line asked for something impossible: exit 2, like argparse
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (PrepareError, debian_text.FetchError, DataError, OSError) as exc:
        print(f"{parser.prog}: failed: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and "cache" not in p.relative_to(out).parts)
    print(f"done in {time.perf_counter() - started:.1f}s: {out} holds {size / 1e6:,.1f} MB (cache not counted)")


if __name__ == "__main__":
    main()
