"""Pass folders of CountingLR lines for the online tests."""

from __future__ import annotations

from pathlib import Path


def write_pass(root: Path, name: str, first_id: int, n: int, *, files: int = 2, done: bool = True) -> list[int]:
    """Folder ``root/name`` with records ``first_id .. first_id + n - 1`` over ``files`` files
    (feature 0 always clicked, feature 1 never: a model that learnt scores AUC 1), and its
    done-file if ``done``. Returns the record ids."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    ids = list(range(first_id, first_id + n))
    for f in range(files):
        lines = [f"{r} {1 - r % 2} {r % 2}\n" for r in ids[f::files]]
        (folder / f"part-{f:05d}").write_text("".join(lines))
    if done:
        (folder / "_SUCCESS").write_text("")
    return ids
