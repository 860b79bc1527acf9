"""Write embeddings in the original word2vec formats (text and binary).

Both are what Mikolov's C tool writes and what ``gensim.models.KeyedVectors.load_word2vec_format``
reads: a header line ``"<count> <dim>\\n"``, then one entry per word. Text entries are
``word v1 ... vd\\n`` with ``%.9g`` floats (enough digits that every float32 reads back exactly);
binary entries are ``word `` followed by ``dim`` little-endian float32 and a newline.

``<UNK>`` is skipped by default: it is not a word and would only pollute nearest-neighbour
lists. Words are written in the order given (the dictionary's, most frequent first), which is
the order gensim's ``restrict_vocab`` counts in.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import ConfigError

#: the dictionary's word for rare words (id 0), written by examples/word2vec/preprocess.py
UNK = "<UNK>"


def export_word2vec(
    vectors: np.ndarray,
    words: Sequence[str],
    path: str | os.PathLike[str],
    binary: bool = False,
    skip: Sequence[str] = (UNK,),
) -> int:
    """Write ``vectors[i]`` as ``words[i]`` for every word not in ``skip``; return the count.

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    vectors = np.asarray(vectors)
    if vectors.ndim != 2 or vectors.shape[0] != len(words):
        raise ConfigError(f"{len(words)} words but vectors of shape {vectors.shape}")
    skipped = set(skip)
    keep = [i for i, w in enumerate(words) if w not in skipped]
    for i in keep:
        w = words[i]
        if not w or any(ch.isspace() for ch in w):
            raise ConfigError(f"word {w!r} (id {i}) is empty or contains whitespace: not writable in word2vec format")
    rows = np.ascontiguousarray(vectors[keep], dtype="<f4")
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(f"{len(keep)} {vectors.shape[1]}\n".encode())
        if binary:
            for j, i in enumerate(keep):
                f.write(words[i].encode("utf-8") + b" " + rows[j].tobytes() + b"\n")
        else:
            fmt = " ".join(["%.9g"] * vectors.shape[1])
            for j, i in enumerate(keep):
                f.write((words[i] + " " + fmt % tuple(rows[j].tolist()) + "\n").encode("utf-8"))
    os.replace(tmp, target)
    return len(keep)
