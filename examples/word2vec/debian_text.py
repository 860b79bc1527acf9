"""Free English text for word2vec from Debian packages, without installing them.

The reference's 1B-word benchmark is a 1.7 GB download from a host that may be unreachable;
Debian's archive is reachable wherever apt works and carries freely licensed English prose. Each
package is fetched with ``apt-get download`` into a cache, unpacked with ``dpkg-deb -x`` into a
temporary folder, and turned into ``OUT/<source>.txt``, one paragraph (verse, fortune) per line;
``SOURCES.md`` records package, version, licence and token counts. Two formats get readers here:
R lazy-load databases (``.rdb``: 4-byte big-endian length + zlib stream per object, each an XDR R
serialization; Jane Austen in r-cran-janeaustenr) and SWORD zText modules (``.bzs`` triplets of
little-endian uint32 offset/size/usize index zlib blocks of OSIS XML; the World English Bible).

Run: ``python examples/word2vec/debian_text.py OUT_DIR`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import html
import json
import lzma
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import groupby, islice
from pathlib import Path
from typing import Any

import numpy as np

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:  # loaded from elsewhere: preprocess sits next to this file
    sys.path.insert(0, str(_HERE))
try:
    import aps  # noqa: F401  (preprocess needs it)
except ImportError:  # a source checkout run without installing aps
    sys.path.insert(0, str(_HERE.parents[1]))

from preprocess import tokenize  # noqa: E402

# ---------------------------------------------------------------- R serialization (XDR) reader

SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP = 1, 2, 9, 10, 13, 14, 15
STRSXP, VECSXP, EXPRSXP, RAWSXP = 16, 19, 20, 24
_ATOMIC = {LGLSXP: ">i4", INTSXP: ">i4", REALSXP: ">f8", CPLXSXP: ">c16", RAWSXP: "u1"}
_PAIRLISTS = {LISTSXP, 6}  # LANGSXP is read the same way
_SPECIAL_ENVS = {254: None, 253: "<globalenv>", 252: "<unbound>", 251: "<missing>", 250: "<basens>", 242: "<emptyenv>", 241: "<baseenv>"}
_REFSXP, _PERSISTSXP, _PACKAGESXP, _NAMESPACESXP = 255, 247, 248, 249


@dataclass
class RObject:
    """An R value: its SEXP type, a Python value and its attributes (``names``, ``class`` ...).

    Strings are ``list[str | None]`` (``None`` is ``NA``), numbers numpy arrays, lists
    ``list[RObject | None]``, pairlists ``list[tuple[tag, value]]``.
    """

    type: int
    value: Any
    attributes: dict[str, Any] = field(default_factory=dict)

    def names(self) -> list[str]:
        names = self.attributes.get("names")
        return list(names.value) if isinstance(names, RObject) else []


class _XdrReader:
    """Cursor over one XDR serialization; keeps the reference table R uses for symbols."""

    def __init__(self, data: bytes) -> None:
        if data[:2] != b"X\n":
            raise ValueError(f"not an XDR R serialization (starts {data[:2]!r})")
        self.data, self.pos, self.refs = data, 2, []
        version = self.int()
        self.int(), self.int()  # writer and minimal reader R versions
        if version == 3:
            skip = self.int()  # length of the native encoding name, then the name
            self.pos += skip
        elif version != 2:
            raise ValueError(f"unsupported R serialization version {version}")

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def length(self) -> int:
        n = self.int()
        return (self.int() << 32) + self.int() if n == -1 else n

    def array(self, dtype: str, n: int) -> np.ndarray:
        arr = np.frombuffer(self.data, dtype, n, self.pos)
        self.pos += arr.nbytes
        return arr

    def item(self) -> Any:
        flags = self.int()
        kind = flags & 0xFF
        if kind in _SPECIAL_ENVS:
            return _SPECIAL_ENVS[kind]
        if kind == _REFSXP:
            return self.refs[(flags >> 8 or self.int()) - 1]
        if kind in (_PERSISTSXP, _PACKAGESXP, _NAMESPACESXP, SYMSXP):
            if kind != SYMSXP and self.int() != 0:
                raise ValueError("bad persistent string vector")
            ref = self.item() if kind == SYMSXP else RObject(kind, [self.item() for _ in range(self.int())])
            self.refs.append(ref)
            return ref
        if kind in _PAIRLISTS:
            return self._pairlist(kind, flags)
        if kind == CHARSXP:
            n = self.int()
            if n == -1:
                return None  # NA_character_
            self.pos += n
            return self.data[self.pos - n:self.pos].decode("latin-1" if flags & (1 << 14) else "utf-8", "replace")
        if (dtype := _ATOMIC.get(kind)) is not None:
            obj = RObject(kind, self.array(dtype, self.length()))
        elif kind in (STRSXP, VECSXP, EXPRSXP):
            obj = RObject(kind, [self.item() for _ in range(self.length())])
        else:
            raise ValueError(f"R type {kind} is not supported by this minimal reader")  # e.g. 238, ALTREP
        if flags & (1 << 9):
            obj.attributes = dict(self.item().value)
        return obj

    def _pairlist(self, kind: int, flags: int) -> RObject:
        cells: list[tuple[str | None, Any]] = []
        while True:  # iterative along the CDR so long pairlists do not recurse
            if flags & (1 << 9):
                self.item()  # attributes of a pairlist cell: not needed
            tag = self.item() if flags & (1 << 10) else None
            cells.append((tag, self.item()))
            flags = self.int()
            if flags & 0xFF not in _PAIRLISTS:
                self.pos -= 4
                if self.item() is not None:
                    raise ValueError("pairlist does not end in NULL")
                return RObject(kind, cells)


def r_unserialize(data: bytes) -> Any:
    """Decode one R serialization in XDR format (what ``saveRDS`` and lazy-load DBs store)."""
    return _XdrReader(data).item()


def read_rdb_chunk(rdb: bytes, offset: int, length: int, compression: int = 1) -> bytes:
    """The serialized bytes of one lazy-load entry: a big-endian ``uint32`` size, then the stream.

    ``compression`` is the ``compressed`` flag of the index: 1 is zlib; 2 and 3 add a type byte
    (``Z`` zlib, ``2`` bzip2, ``X`` xz, ``0`` stored).
    """
    (size,) = struct.unpack_from(">I", rdb, offset)
    body = rdb[offset + 4:offset + length]
    kind = body[:1] if compression in (2, 3) else b"Z"
    decompress = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}[kind]
    body = decompress(body[1:] if compression in (2, 3) else body)
    if len(body) != size:
        raise ValueError(f"lazy-load entry at {offset}: {len(body)} bytes, header says {size}")
    return body


def read_lazyload_db(rdx_path: Path, rdb_path: Path) -> dict[str, Any]:
    """Every variable of an R lazy-load database, by name (the ``.rdx`` index is gzip + XDR)."""
    index = r_unserialize(zlib.decompress(rdx_path.read_bytes(), 47))  # 47: gzip or zlib header
    fields = dict(zip(index.names(), index.value))
    compressed = fields.get("compressed")
    compression = int(compressed.value[0]) if isinstance(compressed, RObject) else 1
    rdb = rdb_path.read_bytes()
    variables = fields["variables"]
    return {name: r_unserialize(read_rdb_chunk(rdb, *map(int, key.value), compression))
            for name, key in zip(variables.names(), variables.value)}


# ---------------------------------------------------------------- SWORD zText reader

def read_ztext_blocks(bzs: bytes, bzz: bytes) -> list[bytes]:
    """Decompress every block of a zText ``.bzz`` using its ``.bzs`` (offset, size, usize) index."""
    blocks = []
    for offset, size, usize in struct.iter_unpack("<III", bzs):
        block = zlib.decompress(bzz[offset:offset + size]) if size else b""
        if len(block) != usize:
            raise ValueError(f"zText block at {offset}: {len(block)} bytes, index says {usize}")
        blocks.append(block)
    return blocks


def read_ztext_entries(bzs: bytes, bzz: bytes, bzv: bytes) -> Iterator[str]:
    """Each verse (entry) in order, from the ``.bzv`` records (block ``u32``, offset ``u32``, size ``u16``)."""
    blocks = read_ztext_blocks(bzs, bzz)
    for block, start, size in struct.iter_unpack("<IIH", bzv):
        if size and block < len(blocks):
            yield blocks[block][start:start + size].decode("utf-8", errors="replace")


_NOTE = re.compile(r"<note\b[^>]*/>|<note\b.*?</note>", re.S)
_INLINE_TAG = re.compile(r"</?(?:w|hi|transChange|foreign|q|seg|name|rdg|catchWord|divineName)\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"\s+")


def osis_to_text(fragment: str) -> str:
    """Plain text of an OSIS fragment: footnotes dropped, word-level tags removed in place,
    structural tags turned into spaces (so words on either side are never glued)."""
    text = _TAG.sub(" ", _INLINE_TAG.sub("", _NOTE.sub(" ", fragment)))
    return _SPACES.sub(" ", html.unescape(text)).strip()


# ---------------------------------------------------------------- plain-text cleaners

def paragraphs(lines: Iterable[str]) -> Iterator[str]:
    """Join runs of non-blank lines into one line each (a window should span a line break)."""
    for nonblank, group in groupby((line.strip() for line in lines), key=bool):
        if nonblank:
            yield " ".join(group)


_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+_.:])\1{2,}\s*$|^[+|][-=+| ]+$")
_RST_ROLE = re.compile(r":[\w.+-]+:(?=`)|<[^<>\s]+>`")


def rst_to_paragraphs(text: str) -> Iterator[str]:
    """Prose paragraphs of reStructuredText: directives, comments, literal (``::``) and doctest
    blocks, section underlines and table borders are dropped, so code does not become words."""
    def lines() -> Iterator[str]:
        skip_deeper_than = None
        for raw in text.splitlines():
            stripped = raw.strip()
            indent = len(raw) - len(raw.lstrip())
            if skip_deeper_than is not None:
                if not stripped or indent > skip_deeper_than:
                    continue
                skip_deeper_than = None
                yield ""  # the skipped block ended a paragraph
            if stripped.startswith(".."):
                skip_deeper_than = indent
                yield ""
            elif stripped.startswith((">>>", "... ", "$ ", "# ")) or _RST_UNDERLINE.match(stripped):
                yield ""
            else:
                if stripped.endswith("::"):
                    skip_deeper_than, stripped = indent, stripped[:-2]
                yield _RST_ROLE.sub("", stripped)
    return paragraphs(lines())


_GCIDE_NOISE = re.compile(r"\[(?:1913 Webster|PJC|WordNet[^\]]*|Century[^\]]*|Webster[^\]]*)\]|\\[^\\\n]*\\")


def gcide_to_paragraphs(text: str) -> Iterator[str]:
    """Definitions of the dictd GCIDE file: source tags (``[1913 Webster]``) and the
    ``\\pro*nun"ci*a`tion\\`` fields removed, braces dropped by the tokenizer."""
    return paragraphs(_GCIDE_NOISE.sub(" ", text).splitlines())


def fortunes_to_paragraphs(text: str) -> Iterator[str]:
    """One line per fortune (they are separated by lines holding only ``%``)."""
    for fortune in re.split(r"^%\s*$", text, flags=re.M):
        yield from paragraphs([" ".join(fortune.split())])


_HTML_DROP = re.compile(r"<(script|style|pre|head)\b.*?</\1\s*>|<!--.*?-->", re.S | re.I)
_HTML_BLOCK = re.compile(r"</?(?:p|div|li|dt|dd|h[1-6]|tr|td|th|table|ul|ol|dl|br|blockquote|section|title)\b[^>]*>", re.I)


def html_to_paragraphs(text: str) -> Iterator[str]:
    """Prose of an HTML page: scripts, styles and ``<pre>`` code blocks dropped, block elements
    turned into paragraph breaks, every other tag removed in place, entities decoded."""
    text = _HTML_BLOCK.sub("\n\n", _HTML_DROP.sub(" ", text))
    return paragraphs(html.unescape(_TAG.sub("", text)).splitlines())


_POD_CODE = re.compile(r"[CF]<(?:<+\s.*?\s>+|[^<>]*)>", re.S)
_POD_FORMAT = re.compile(r"[A-Z]<(?:<+\s)?([^<>]*?)(?:\s>+)?>")


def pod_to_paragraphs(text: str) -> Iterator[str]:
    """Prose of Perl POD: verbatim (indented) blocks and code/file names (``C<>``, ``F<>``)
    dropped, command paragraphs (``=head1`` ...) kept as their text, other formatting codes
    (``B<>``, ``I<>``, ``L<>`` ...) replaced by their content."""
    def lines() -> Iterator[str]:
        for raw in _POD_CODE.sub(" ", text).splitlines():
            if raw[:1].isspace():
                yield ""
            elif raw.startswith("="):
                yield ""
                yield raw.partition(" ")[2] if raw.startswith(("=head", "=item")) else ""
                yield ""
            else:
                for _ in range(3):  # nested codes, innermost first
                    raw = _POD_FORMAT.sub(r"\1", raw)
                yield raw
    return paragraphs(lines())


_ASCIIDOC_FENCE = re.compile(r"^(-{4,}|\.{4,}|={4,}|\+{4,}|_{4,}|\*{4,}|\|===)\s*$")


def asciidoc_to_paragraphs(text: str) -> Iterator[str]:
    """Prose of AsciiDoc: delimited blocks (listings, literals, tables), attribute lines, titles'
    underlines and include directives dropped. A delimiter line right under a line of text is a
    title's underline, not the start of a block."""
    def lines() -> Iterator[str]:
        fenced = None
        previous = ""
        for raw in text.splitlines():
            stripped = raw.strip()
            if fenced is not None:
                if stripped == fenced:
                    fenced = None
                continue
            underline = bool(previous)
            previous = stripped
            if _ASCIIDOC_FENCE.match(stripped):
                if not underline:
                    fenced = stripped
                previous = ""
                yield ""
            elif stripped.startswith(("[", ":", "include::", "ifdef::", "endif::", "//")) or raw[:1].isspace():
                yield ""
            else:
                yield stripped
    return paragraphs(lines())


_DICTD_SENSE = re.compile(r"^\s+(?:[a-z]{1,4} )?\d+: ")


def dictd_to_paragraphs(text: str) -> Iterator[str]:
    """Entries of a dictd ``.dict`` file, one paragraph per headword line (not indented) or
    numbered sense (``  n 1: ...``, WordNet's layout), the database's own ``00-database-*``
    header entries skipped."""
    def lines() -> Iterator[str]:
        for raw in text.splitlines():
            if raw[:1] not in ("", " ", "\t") or _DICTD_SENSE.match(raw):
                yield ""
            yield raw
    return (p for p in paragraphs(lines()) if not p.startswith("00-database") and "00database" not in p)


# ---------------------------------------------------------------- the sources

def _read_text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix in (".gz", ".dz") else data).decode("utf-8", "replace")


def _austen(root: Path) -> Iterator[str]:
    for rdx in sorted(root.glob("usr/lib/R/site-library/janeaustenr/data/*.rdx")):
        for obj in read_lazyload_db(rdx, rdx.with_suffix(".rdb")).values():
            if isinstance(obj, RObject) and obj.type == STRSXP:
                yield from paragraphs(s or "" for s in obj.value)


def _sword(root: Path) -> Iterator[str]:
    for module in sorted(root.glob("usr/share/sword/modules/texts/ztext/*")):
        for testament in ("ot", "nt"):
            parts = [module / f"{testament}.{ext}" for ext in ("bzs", "bzz", "bzv")]
            if all(p.exists() for p in parts):
                yield from filter(None, map(osis_to_text, read_ztext_entries(*(p.read_bytes() for p in parts))))


def _files(pattern: str, clean: Callable[[str], Iterable[str]], skip: str = r"^$") -> Callable[[Path], Iterator[str]]:
    """An extractor: ``clean`` the text of each regular file matching ``pattern`` but not ``skip``."""
    def extract(root: Path) -> Iterator[str]:
        for f in sorted(root.glob(pattern)):
            if f.is_file() and not f.is_symlink() and not re.search(skip, f.as_posix()):
                yield from clean(_read_text(f))
    return extract


_gcide = _files("usr/share/dictd/*.dict.dz", gcide_to_paragraphs)
_jargon = _files("usr/share/doc/jargon-text/jargon.txt*", lambda text: paragraphs(text.splitlines()))
_fortunes = _files("usr/share/games/fortunes/*", fortunes_to_paragraphs, r"\.(dat|u8)$|ascii-art")
# the changelog is mostly issue numbers
_python_doc = _files("usr/share/doc/python3*/html/_sources/**/*.rst.txt", rst_to_paragraphs, "whatsnew/changelog")
# translations are not English; devicetree bindings are mostly property listings
_perl_doc = _files("usr/share/perl/*/pod/*.pod", pod_to_paragraphs, "perl5[0-9]+delta|perlhist")
_postgres_doc = _files("usr/share/doc/postgresql-doc-*/html/*.html", html_to_paragraphs, "release-")
_git_doc = _files("usr/share/doc/git-doc/*.txt", asciidoc_to_paragraphs, "RelNotes")
_handbook = _files("usr/share/doc/debian-handbook/html/en-US/*.html", html_to_paragraphs)
_debian_reference = _files("usr/share/debian-reference/*.en.html", html_to_paragraphs)
_gimp_help = _files("usr/share/gimp/2.0/help/en/**/*.html", html_to_paragraphs)
_dictd = _files("usr/share/dictd/*.dict.dz", dictd_to_paragraphs)
_linux_doc = _files("usr/share/doc/linux-doc-*/Documentation/**/*", rst_to_paragraphs,
                    r"/translations/|/devicetree/bindings/|^(?!.*\.(rst|txt)(\.gz)?$)")


@dataclass(frozen=True)
class Source:
    """A Debian package and how to get prose out of it.

    ``package`` may be a metapackage; it is then replaced by its first dependency starting with
    ``resolve_prefix`` (``linux-doc`` → ``linux-doc-6.1``), so the list survives a Debian release.
    ``licence_hint`` is used only when the copyright file is not machine-readable.
    """

    name: str
    package: str
    extract: Callable[[Path], Iterator[str]]
    licence_hint: str
    description: str
    resolve_prefix: str | None = None
    default: bool = True


SOURCES: tuple[Source, ...] = (
    Source("austen", "r-cran-janeaustenr", _austen, "MIT", "Jane Austen's six novels"),
    Source("web_bible", "sword-text-web", _sword, "public-domain", "World English Bible"),
    Source("gcide", "dict-gcide", _gcide, "GPL-2+", "Collaborative International Dictionary of English"),
    Source("jargon", "jargon-text", _jargon, "public domain", "The Jargon File"),
    Source("fortunes_min", "fortunes-min", _fortunes, "BSD-style", "fortune cookies: fortunes, literature, riddles"),
    Source("fortunes", "fortunes", _fortunes, "BSD-style", "fortune cookies: the other collections"),
    Source("python_doc", "python3-doc", _python_doc, "PSF-2.0", "Python documentation (reST sources)", "python3."),
    Source("linux_doc", "linux-doc", _linux_doc, "GPL-2", "Linux kernel documentation (reST, text)", "linux-doc-"),
    Source("kjv_bible", "sword-text-kjv", _sword, "public-domain", "King James Bible", default=False),
    # the second corpus (none of the packages above): manuals, a handbook and three dictionaries
    Source("perl_doc", "perl-doc", _perl_doc, "GPL-1+ or Artistic", "Perl documentation (POD)", default=False),
    Source("postgres_doc", "postgresql-doc", _postgres_doc, "PostgreSQL", "PostgreSQL manual (HTML)",
           "postgresql-doc-", default=False),
    Source("git_doc", "git-doc", _git_doc, "GPL-2", "Git manual pages and guides (AsciiDoc)", default=False),
    Source("debian_handbook", "debian-handbook", _handbook, "GPL-2+ or CC-BY-SA-3.0",
           "The Debian Administrator's Handbook (HTML)", default=False),
    Source("debian_reference", "debian-reference-en", _debian_reference, "GPL-2+", "Debian Reference (HTML)",
           default=False),
    Source("devil", "dict-devil", _dictd, "public domain", "Ambrose Bierce's The Devil's Dictionary", default=False),
    Source("foldoc", "dict-foldoc", _dictd, "GFDL-1.1+", "Free On-line Dictionary of Computing", default=False),
    Source("wordnet", "dict-wn", _dictd, "WordNet", "WordNet glosses and examples", default=False),
    Source("gimp_help", "gimp-help-en", _gimp_help, "GFDL-1.2+", "GIMP user manual (HTML)", default=False),
)

#: ``--debian-sources second``: a corpus made only of packages the default corpus does not use
SECOND_CORPUS = ("perl_doc", "postgres_doc", "git_doc", "debian_handbook", "debian_reference", "devil", "foldoc",
                 "wordnet", "gimp_help")


# ---------------------------------------------------------------- Debian plumbing

class FetchError(RuntimeError):
    """A package could not be found or unpacked; the message says why."""


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def _apt_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("W:")]  # W: unsandboxed download
    return "; ".join(lines) or f"exit status {result.returncode}"


class Apt:
    """``apt-get download`` into a cache; runs ``apt-get update`` once if apt knows no packages yet."""

    def __init__(self, cache_dir: Path, log: Callable[[str], None]) -> None:
        self.cache_dir, self.log, self._updated = cache_dir, log, False
        cache_dir.mkdir(parents=True, exist_ok=True)

    def _update_once(self, result: subprocess.CompletedProcess[str]) -> bool:
        if self._updated or not re.search(r"Unable to locate package|No packages found", result.stderr):
            return False
        self._updated = True
        self.log("  apt does not know the package: running apt-get update once")
        return _run(["apt-get", "update"]).returncode == 0

    def resolve(self, source: Source) -> str:
        if source.resolve_prefix is None:
            return source.package
        if cached := sorted(self.cache_dir.glob(f"{source.resolve_prefix}*.deb")):
            return cached[-1].name.split("_")[0]  # offline rerun: the cache holds the resolved package
        while True:
            result = _run(["apt-cache", "depends", source.package])
            for dep in re.findall(r"^\s*Depends:\s*(\S+)", result.stdout, re.M):
                if dep.startswith(source.resolve_prefix):
                    return dep
            if not self._update_once(result):
                raise FetchError(f"{source.package}: no dependency {source.resolve_prefix}* ({_apt_error(result)})")

    def download(self, package: str) -> Path:
        while not (debs := sorted(self.cache_dir.glob(f"{package}_*.deb"))):
            result = _run(["apt-get", "download", package], cwd=self.cache_dir)
            if result.returncode != 0 and not self._update_once(result):
                raise FetchError(f"apt-get download {package}: {_apt_error(result)}")
        return debs[-1]


def licence_from_copyright(text: str) -> str | None:
    """The ``License`` of the ``Files: *`` stanza of a machine-readable (DEP-5) copyright file."""
    if not text.startswith("Format:"):
        return None
    for stanza in re.split(r"\n[ \t]*\n", text):
        if re.search(r"^Files:\s*\*\s*$", stanza, re.M) and (m := re.search(r"^License:\s*(\S.*)$", stanza, re.M)):
            return m.group(1).strip()
    return None


@dataclass
class SourceResult:
    """What one source produced: a row of SOURCES.md and of ``sources.json``."""

    name: str
    package: str
    version: str
    licence: str
    licence_from: str
    description: str
    file: str
    lines: int
    tokens: int
    bytes: int
    seconds: float


def extract_source(source: Source, apt: Apt, out_dir: Path) -> SourceResult:
    """Download, unpack into a temporary folder, write ``OUT/<name>.txt``; the .deb stays cached."""
    started = time.perf_counter()
    package = apt.resolve(source)
    deb = apt.download(package)
    version = _run(["dpkg-deb", "-f", str(deb), "Version"]).stdout.strip() or "?"
    with tempfile.TemporaryDirectory(dir=apt.cache_dir) as tmp:
        root = Path(tmp)
        if (result := _run(["dpkg-deb", "-x", str(deb), tmp])).returncode != 0:
            raise FetchError(f"dpkg-deb -x {deb}: {result.stderr.strip()}")
        licence, licence_from = source.licence_hint, "hand summary"
        copyright_file = root / "usr/share/doc" / package / "copyright"
        if copyright_file.is_file():
            (out_dir / "copyright").mkdir(exist_ok=True)
            shutil.copyfile(copyright_file, out_dir / "copyright" / f"{package}.txt")
            if parsed := licence_from_copyright(copyright_file.read_text("utf-8", "replace")):
                licence, licence_from = parsed, "Files: *"
        target, partial = out_dir / f"{source.name}.txt", out_dir / f".{source.name}.txt.tmp"
        lines = tokens = 0
        paragraphs_ = (p.replace("\n", " ") for p in source.extract(root))
        with open(partial, "w", encoding="utf-8") as f:
            while batch := list(islice(paragraphs_, 4096)):
                block = "\n".join(batch) + "\n"
                f.write(block)
                lines, tokens = lines + len(batch), tokens + len(tokenize(block))
        partial.replace(target)
    return SourceResult(source.name, package, version, licence, licence_from, source.description,
                        target.name, lines, tokens, target.stat().st_size,
                        round(time.perf_counter() - started, 2))


def write_sources_md(out_dir: Path, results: list[SourceResult]) -> None:
    """The human-readable record: what came from where, under which licence, how many tokens."""
    rows = [f"| {r.name} | {r.description} | `{r.package}` | {r.version} | {r.licence} ({r.licence_from}) "
            f"| {r.lines:,} | {r.tokens:,} |" for r in results]
    (out_dir / "SOURCES.md").write_text("\n".join([
        "# Text sources", "",
        "Written by `examples/word2vec/debian_text.py`. Each `<source>.txt` holds plain text taken from a",
        "Debian package (fetched with `apt-get download`, unpacked with `dpkg-deb -x`, never installed),",
        "one paragraph, verse or fortune per line. Tokens are lower-cased runs of letters",
        "(`examples/word2vec/preprocess.py`: `tokenize`).", "",
        "| source | content | package | version | licence | lines | tokens |",
        "|---|---|---|---|---|---:|---:|", *rows, "",
        f"Total: {sum(r.tokens for r in results):,} tokens in {sum(r.lines for r in results):,} lines.", "",
        "Licence: *Files: \\** is the `License` field of the `Files: *` stanza of the package's",
        "machine-readable copyright file; *hand summary* is a summary of a free-form copyright file.",
        "Each package's full copyright file is in `copyright/<package>.txt` next to this file.", ""]),
        encoding="utf-8")


def fetch_debian_text(out_dir: str | Path, cache_dir: str | Path | None = None,
                      names: Iterable[str] | None = None, force: bool = False,
                      log: Callable[[str], None] = print) -> list[SourceResult]:
    """Make ``OUT/<source>.txt`` for each source (default: those with ``default=True``).

    A source whose text file and record exist is not fetched again, so a rerun is instant; a
    source that fails (say, a package missing from this Debian release) is reported and skipped.
    The .deb files stay in ``cache_dir`` (default ``OUT/../cache/debian``) for a ``force`` rerun.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = list(names) if names is not None else None
    if names == ["second"]:  # the command line's shorthand
        names = list(SECOND_CORPUS)
    if names is not None and (unknown := set(names) - {s.name for s in SOURCES}):
        raise FetchError(f"unknown source(s) {sorted(unknown)}; known: {[s.name for s in SOURCES]}")
    wanted = [s for s in SOURCES if (s.name in names if names is not None else s.default)]
    record_path = out / "sources.json"
    records = {} if force or not record_path.exists() else {
        r["name"]: SourceResult(**r) for r in json.loads(record_path.read_text())}
    apt = Apt(Path(cache_dir) if cache_dir else out.parent / "cache" / "debian", log)
    results: list[SourceResult] = []
    for source in wanted:
        if (cached := records.get(source.name)) is not None and (out / cached.file).exists():
            results.append(cached)
            continue
        try:
            result = extract_source(source, apt, out)
        except (FetchError, ValueError, OSError) as exc:
            log(f"  {source.name:<13} skipped: {exc}")
            continue
        log(f"  {source.name:<13} {result.package:<19} {result.version:<17} {result.licence:<14} "
            f"{result.lines:>9,} lines {result.tokens:>11,} tokens {result.seconds:6.1f}s")
        results.append(result)
        records[source.name] = result
        record_path.write_text(json.dumps([asdict(r) for r in records.values()], indent=1))
    if not results:
        raise FetchError("no Debian text source could be fetched (is apt configured? try apt-get update)")
    write_sources_md(out, results)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Extract freely licensed English text from Debian packages (nothing is installed).",
        epilog="sources: " + ", ".join(f"{s.name} ({s.package}{'' if s.default else '; opt-in'})" for s in SOURCES))
    parser.add_argument("out", type=Path, help="directory for <source>.txt, SOURCES.md and copyright/")
    parser.add_argument("--cache", type=Path, help="where .deb files are kept (default: OUT/../cache/debian)")
    parser.add_argument("--sources", help="comma-separated source names (default: every non-opt-in source)")
    parser.add_argument("--force", action="store_true", help="extract again even when the text exists")
    args = parser.parse_args(argv)
    try:
        results = fetch_debian_text(args.out, args.cache, args.sources.split(",") if args.sources else None, args.force)
    except FetchError as exc:
        raise SystemExit(f"error: {exc}") from exc
    print(f"{sum(r.tokens for r in results):,} tokens from {len(results)} sources in {args.out}")


if __name__ == "__main__":
    main()
