"""The documentation says what works: README's library example runs as written, every relative
link points to a file, every `aps-...` command exists, every dotted `aps.` name and every import
in a Python block resolves."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKDOWN = [README, *DOCS]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_COMMAND = re.compile(r"(?<![\w./-])(aps-[a-z]+)\b")
_DOTTED = re.compile(r"(?<![\w./-])(aps(?:\.[A-Za-z_]\w*)+)")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(text: str, lang: str | None = None) -> list[str]:
    return [body for tag, body in _FENCE.findall(text) if lang is None or tag == lang]


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next heading of level 2."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README has no '## {heading}' section"
    return match.group(1)


def library_example() -> str:
    blocks = fenced_blocks(section(README.read_text(encoding="utf-8"), "The library"), "python")
    assert blocks, "no ```python block under '## The library'"
    return blocks[0]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(_FENCE, "", path.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


# ------------------------------------------------------------------ the library example


@pytest.mark.slow
def test_readme_library_example_runs(tmp_path: Path) -> None:
    """It starts an in-process pserver on port 0 and saves to ./model, so it runs in tmp_path."""
    code = library_example()
    assert "port=0" in code, "the example must not depend on a fixed port"
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "row 3 moved by 2.0" in result.stdout, output  # SGD lr 1.0, id 3 twice with gradient 1
    assert "tables: ['emb', 'fc1.w']" in result.stdout, output
    saved = tmp_path / "model" / "epoch_0" / "shard-00000-of-00001"
    assert (saved / "manifest.json").is_file(), output


# ------------------------------------------------------------------ links, commands, names


@pytest.mark.parametrize("path", MARKDOWN, ids=_rel)
def test_relative_links_point_to_existing_files(path: Path) -> None:
    text = re.sub(_FENCE, "", path.read_text(encoding="utf-8"))
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {_rel(dest)})")
    assert not broken, f"{_rel(path)}: broken links: {broken}"


def test_readme_links_every_doc() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [_rel(d) for d in DOCS if f"]({_rel(d)})" not in text]
    assert not missing, f"README does not link {missing}"


def test_every_aps_command_in_readme_exists() -> None:
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"])
    installed = scripts | {p.name for p in (ROOT / "bin").iterdir() if p.name.startswith("aps-")}
    named = set(_COMMAND.findall(README.read_text(encoding="utf-8")))
    assert named, "README names no aps-... command"
    assert not named - installed, f"README names commands that neither bin/ nor pyproject provide: {sorted(named - installed)}"


def _resolve(dotted: str) -> bool:
    """Does ``aps.x.y.z`` name a module or an attribute of one?"""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ModuleNotFoundError:
            return False
    return True


@pytest.mark.parametrize("path", MARKDOWN, ids=_rel)
def test_dotted_aps_names_resolve(path: Path) -> None:
    """`aps.trainer.Strategy`, `aps.SparseTable(...)`: every dotted name in code resolves."""
    text = path.read_text(encoding="utf-8")
    code = " ".join(_CODE_SPAN.findall(re.sub(_FENCE, "", text)) + fenced_blocks(text, "python"))
    names = sorted(set(_DOTTED.findall(code)))
    unresolved = [n for n in names if not _resolve(n)]
    assert not unresolved, f"{_rel(path)}: names that do not exist: {unresolved}"


@pytest.mark.parametrize("path", MARKDOWN, ids=_rel)
def test_python_blocks_compile_and_their_imports_work(path: Path) -> None:
    """Every ```python block is valid Python, and every `import` / `from ... import` in it works
    (the rest of a block may need a running cluster or data, so only README's library example
    is run whole)."""
    for block in fenced_blocks(path.read_text(encoding="utf-8"), "python"):
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    importlib.import_module(alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module:
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                        f"{_rel(path)}: from {node.module} import {alias.name} fails"
                    )


# ------------------------------------------------------------------ claims the code must bear out


def test_readme_states_the_clients_retry_rule_as_the_code_has_it() -> None:
    """A lost connection is retried for ``deadline`` seconds, not a number of times."""
    from aps.client.retry import DEFAULT_DEADLINE

    library = section(README.read_text(encoding="utf-8"), "The library")
    sentence = " ".join(re.search(r"^\* Every call has one timeout budget.*?(?=^\* )", library, re.S | re.M).group(0).split())
    assert "`deadline`" in sentence and f"{DEFAULT_DEADLINE:g} s by default" in sentence, sentence
    assert not re.search(r"lost connections? (are|is) retried \(\d+ times", sentence), sentence


def test_only_mode_class_reads_a_mode_name() -> None:
    """docs/modes.md says :func:`aps.trainer.modes.mode_class` is the one place a mode's name is
    read (besides fleet's mapping of the reference's flags onto one): no other module compares
    a ``mode`` to a mode's name."""
    from aps.trainer.strategy import MODES

    allowed = {"aps/trainer/modes/__init__.py", "aps/fleet.py"}
    found = []
    for path in sorted((ROOT / "aps").rglob("*.py")):
        rel = _rel(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = [s for s in sides if isinstance(s, ast.Constant) and s.value in MODES]
            modes = [s for s in sides if (isinstance(s, ast.Attribute) and s.attr.endswith("mode"))
                     or (isinstance(s, ast.Name) and s.id.endswith("mode"))]
            if names and modes and rel not in allowed:
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"mode names compared outside mode_class: {found}"


#: things the docs once said that the code does not do: (file, pattern, what is true)
FALSE_CLAIMS = [
    ("docs/protocol.md", r"one connection per \(client, pserver\) pair", "one connection per pserver port"),
    ("docs/concepts.md", r"one connection per pserver(?! port)", "one connection per pserver port"),
    ("README.md", r"One connection per pserver(?! port),", "one connection per pserver port"),
    ("docs/modes.md", r"pushed row is written once", "the ascending-id copy for the push writes it again"),
]


@pytest.mark.parametrize("file,pattern,truth", FALSE_CLAIMS, ids=[c[1] for c in FALSE_CLAIMS])
def test_docs_no_longer_say_what_the_code_does_not_do(file: str, pattern: str, truth: str) -> None:
    text = " ".join((ROOT / file).read_text(encoding="utf-8").split())
    assert not re.search(pattern, text), f"{file} says /{pattern}/; the code: {truth}"


def test_readme_keeps_benchmarks_to_a_summary() -> None:
    """The full tables live in bench/README.md; README keeps the headline ratios and a link."""
    summary = section(README.read_text(encoding="utf-8"), "Benchmarks")
    assert len(summary.strip().splitlines()) <= 12 and "|---" not in summary
    assert "bench/README.md" in summary
    bench = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    assert "## Latest results on 2 cores" in bench and "| batched pull, 1 client: rows/s |" in bench
