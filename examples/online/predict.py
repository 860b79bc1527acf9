"""Score CTR lines with the parameters aps-serve serves: the online half of the loop.

    python examples/online/predict.py --serve 127.0.0.1:7200 --data data/ctr/test_data \\
        --model-arg table=hash [--out scores.txt] [--json result.json]

Each batch of lines is parsed by the model's own batcher and scored by its own forward pass (the
code that trains it; aps/models/). Its rows come from aps-serve: a hash table's rows by the
batch's keys (an unknown key reads its initial row), fixed and dense tables whole, pulled again
whenever the served model version changes, so every batch is scored with one version (printed
with the result). With labels in the lines, prints AUC and logloss; ``--out`` writes one click
probability per line, in the input's order. Pass the ``--model-arg`` values the model was
trained with: a table of another shape is refused, not guessed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

import aps  # noqa: E402
from aps.errors import ApsError  # noqa: E402
from aps.metrics import Auc, logloss  # noqa: E402
from aps.models import build_model  # noqa: E402
from aps.specs import DenseTable, HashTable, SparseTable  # noqa: E402
from aps.trainer.files import expand_inputs  # noqa: E402
from aps.trainer.model import Batch, Model, Params, WorkerContext  # noqa: E402
from aps.trainer.reader import read_chunks  # noqa: E402


class ServedParams:
    """The model's parameters from aps-serve, one model version at a time."""

    def __init__(self, model: Model, client: aps.PSClient) -> None:
        self.client = client
        self.hashed = [s for s in model.tables() if isinstance(s, HashTable)]
        self.whole = [s for s in model.tables() if not isinstance(s, HashTable)]
        self.version: int | None = None
        self.sparse: dict[str, np.ndarray] = {}
        self.dense: dict[str, np.ndarray] = {}
        self.versions_used: set[int] = set()

    async def check_shapes(self) -> None:
        for spec in self.hashed + self.whole:
            served = (await self.client.table_info(spec.name)).spec
            if _shape(served) != _shape(spec):
                raise aps.ConfigError(f"aps-serve's table {spec.name!r} is {_shape(served)}, the model's {_shape(spec)}: "
                                      "pass the --model-arg values it was trained with")

    async def for_batch(self, batch: Batch) -> Params:
        """The batch's parameters, all of one model version."""
        while True:
            rows, versions = {}, set()
            for spec in self.hashed:
                rows[spec.name], version = await self.client.pull_sparse(spec.name, batch.sparse_ids[spec.name], with_version=True)
                versions.add(version)
            if self.version is None or versions - {self.version}:
                await self._refresh()
            if versions <= {self.version}:
                self.versions_used.add(self.version)  # type: ignore[arg-type]
                return Params({**self.sparse, **rows}, self.dense)

    async def _refresh(self) -> None:
        """Fixed and dense tables whole, again, from one version."""
        while True:
            sparse, dense, versions = {}, {}, set()
            for spec in self.whole:
                if isinstance(spec, SparseTable):
                    sparse[spec.name], v = await self.client.pull_sparse(spec.name, np.arange(spec.rows), with_version=True)
                else:
                    dense[spec.name], v = await self.client.pull_dense(spec.name, with_version=True)
                versions.add(v)
            if len(versions) <= 1:
                self.sparse, self.dense = sparse, dense
                self.version = versions.pop() if versions else self.client.model_version
                return


def _shape(spec: Any) -> tuple[Any, ...]:
    if isinstance(spec, HashTable):
        return ("keys", spec.dim)
    return (spec.rows, spec.dim) if isinstance(spec, SparseTable) else tuple(spec.shape)


async def score(model: Model, client: aps.PSClient, files: list[str], out: TextIO | None, skip_bad_lines: bool = False) -> dict[str, Any]:
    params = ServedParams(model, client)
    await params.check_shapes()
    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0), skip_bad_lines=skip_bad_lines)
    auc, loss_sum, examples = Auc(), 0.0, 0
    for path in expand_inputs(files):
        async for chunk in read_chunks(path, chunk_bytes=4 << 20):
            for batch in model.batches(chunk, ctx):
                model.forward(batch, await params.for_batch(batch))
                probs, labels = model.predictions(batch)
                auc.update(probs, labels)
                loss_sum += logloss(probs, labels) * len(labels)
                examples += len(labels)
                if out is not None:
                    out.writelines(f"{p:.6f}\n" for p in probs)
    if not examples:
        raise aps.DataError("no examples in the input files", ", ".join(files))
    return {"auc": auc.global_auc(), "logloss": loss_sum / examples, "examples": examples,
            "model_versions": sorted(params.versions_used), "bad_lines": ctx.bad_lines}


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    model = build_model(args.model, args.model_arg)
    token = Path(args.token_file).read_text().rstrip("\r\n") if args.token_file else os.environ.get("APS_TOKEN")
    async with aps.connect([args.serve], token=token) as client:
        if args.out:
            with open(args.out, "w") as out:
                return await score(model, client, args.data, out, args.skip_bad_lines)
        return await score(model, client, args.data, None, args.skip_bad_lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", required=True, metavar="HOST:PORT", help="the aps-serve process to pull parameters from")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="CTR lines: files, directories or globs")
    p.add_argument("--model", default="ctr_dnn", help="model name or module:Class (default ctr_dnn)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="model argument used in training (repeatable)")
    p.add_argument("--token-file", metavar="PATH", help="aps-serve's token (or APS_TOKEN)")
    p.add_argument("--out", metavar="PATH", help="write one click probability per line here")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON here")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of failing")
    args = p.parse_args(argv)
    try:
        result = asyncio.run(amain(args))
    except ApsError as exc:
        print(f"predict: error: {exc}", file=sys.stderr)
        return 2
    print(f"AUC {result['auc']:.6f}  logloss {result['logloss']:.6f}  examples {result['examples']}  "
          f"model versions {result['model_versions']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
