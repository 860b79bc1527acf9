"""Online scoring with a :class:`~aps.torch.TorchModel`: its network, fed by aps-serve.

    async with Predictor.open(model, "127.0.0.1:7200", "/data/ckpt/exports") as p:
        probs = await p.score_lines(lines)          # Criteo / meta.json lines -> float32 [n]
        await p.refresh()                           # now and then: a newer export's dense tables

Where each value comes from:

* **Sparse rows** (every :class:`~aps.torch.Embedding` table): pulled from the aps-serve process
  at every call, by the batch's unique ids, one PULL_SPARSE per table, the tables' requests in
  flight together (aps-serve speaks the pserver protocol: ``aps.connect([address])``). Each
  reply says the model version it was read from.
* **Dense tables** (every parameter of the network): read from the export root that aps-serve
  follows, once per model version, by aps-serve's own reader (:mod:`aps.serving.model`, every
  file checked against the SHA-256 its export's manifest gives), and kept in memory. Fixed and
  dense tables are written whole in every export, base or delta, so version ``V``'s dense values
  are export ``V``'s. Nothing is read from disk on the scoring path.

**One version per prediction.** A call whose rows come from another version than the dense
tables held (aps-serve applied a newer export since) loads that version's dense tables first,
then pulls its rows again, so every probability is computed from one model version
(:attr:`Predictor.version`). That load costs the call a file read (a few ms for DeepFM's
dense tables); a server that wants none on its request path calls :meth:`Predictor.refresh`
on a timer (aps-serve's ``--poll``), which loads a newer version ahead of the requests.

**A key aps-serve does not hold** (never trained, not admitted, under the export's score
threshold - a base writes the keys whose score reached ``base_threshold``, a delta those whose
delta score reached ``delta_threshold`` - or shrunk away before the base) reads that table's
*initial row for that key*: the row the table's ``init`` draws from (table seed, key), the same
row a pserver answers for a key it never held (``aps.serving.model.ServedHash.pull``). It is not
zeros and not an error, and it is not the value a pserver holding a trained but unexported key
would give: serving sees only what was exported. A fixed table serves every id in
``[0, rows)``; the ids a fixed table's batch reads are hashed into that range, so none is
unknown. A table aps-serve does not serve at all fails :meth:`Predictor.open` with one line.

Lines are the model's training format (its label fields first; any 0/1 labels: they are not
used for the probability) or, with ``labelled=False``, the same without the label fields. A bad line raises
:class:`~aps.errors.DataError` naming it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..client.psclient import PSClient, connect
from ..errors import ConfigError, DataError
from ..models.ctr_eval import summarize, table_shape
from ..serving.layout import list_exports, read_manifest
from ..serving.model import ExportFiles  # aps-serve's reader of an export's files: no second reader
from ..specs import TABLE_SPECS, DenseTable, HashTable, SparseTable, spec_from_dict
from ..trainer.files import expand_inputs
from ..trainer.model import Batch, WorkerContext
from ..trainer.reader import Chunk, read_chunks
from .model import TorchModel

#: a call re-pulls at most this many times while aps-serve keeps moving to newer versions
_MAX_TRIES = 8


class Predictor:
    """Click probabilities from ``model``'s network with the parameters aps-serve serves.

    ``serve``: aps-serve's ``HOST:PORT`` (or an open :class:`~aps.PSClient` to it, which the
    predictor then does not close); ``export_dir``: the export root that aps-serve follows, as
    this process sees it. ``token``, ``timeout``, ``busy_poll``: :func:`aps.connect`'s
    (``busy_poll=0.0002`` cuts a one-at-a-time caller's latency at the cost of a spinning CPU).

    Open with ``p = await Predictor.open(...)`` (then ``await p.aclose()``) or
    ``async with Predictor.open(...) as p``, as :func:`aps.connect`. Calls may run concurrently.
    The network's forward pass runs on the event loop (no thread hop at batch 1).
    """

    def __init__(
        self, model: TorchModel, serve: str | PSClient, export_dir: str | os.PathLike[str], *, token: str | None = None,
        timeout: float | None = 30.0, busy_poll: float = 0.0,
    ) -> None:
        if not isinstance(model, TorchModel):
            raise ConfigError(f"Predictor scores an aps.torch.TorchModel, got {type(model).__name__}")
        self.model = model
        self.export_dir = Path(export_dir)
        self._owns_client = not isinstance(serve, PSClient)
        self.client = connect([serve], token=token, timeout=timeout, busy_poll=busy_poll) if self._owns_client else serve
        if self.client.num_servers != 1:
            raise ConfigError(f"aps-serve is one server; the client given has {self.client.num_servers}")
        self.address = self.client.addresses[0]
        specs = model.tables()
        #: the Embedding tables, pulled at every call
        self.sparse: list[SparseTable | HashTable] = [s for s in specs if s.by_ids]  # type: ignore[misc]
        #: the dense tables, read from the exports once per version
        self.dense_specs: dict[str, DenseTable] = {s.name: s for s in specs if not s.by_ids}  # type: ignore[misc]
        # the dense values held, in buffers that stay put: a new version is copied into them, so the
        # network's parameters are bound to the same arrays every call (aps.torch.dense.DenseBinding
        # keeps one torch view per array address)
        self._dense = {name: np.zeros(spec.shape, np.float32) for name, spec in self.dense_specs.items()}
        self._ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0))
        self._lock = asyncio.Lock()
        #: the model version whose dense tables are held (every prediction is of this version)
        self.version: int | None = None
        #: versions loaded so far, in order
        self.versions_loaded: list[int] = []
        self._opened = False
        self._closed = False

    @property
    def dense(self) -> Mapping[str, np.ndarray]:
        """The dense tables held (of :attr:`version`), by table name, in their shapes: the
        arrays the network's parameters are bound to (read them, do not write them)."""
        return self._dense

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def open(
        cls, model: TorchModel, serve: str | PSClient, export_dir: str | os.PathLike[str], **options: Any,
    ) -> Predictor:
        """A predictor to ``await`` (or enter with ``async with``): it connects, checks that
        aps-serve serves the model's tables with its shapes and that ``export_dir`` holds the
        version served, and loads that version's dense tables."""
        return cls(model, serve, export_dir, **options)

    def __await__(self) -> Generator[Any, None, Predictor]:
        return self._open().__await__()

    async def __aenter__(self) -> Predictor:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _open(self) -> Predictor:
        if self._opened:
            return self
        try:
            if self._owns_client:
                await self.client.open()
            if not self.export_dir.is_dir():
                raise ConfigError(f"export root {self.export_dir}: no such directory")
            served = await self.served_version()
            if served is None:
                raise ConfigError(f"aps-serve at {self.address} serves no export yet: open the predictor once its first export is done")
            await self._check_tables()
            await self._use(served)
        except BaseException:
            await self.aclose()
            raise
        self._opened = True
        return self

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._owns_client:
                await self.client.aclose()

    # ------------------------------------------------------------ versions

    async def served_version(self) -> int | None:
        """The model version aps-serve serves now (None: no export loaded yet), from its STATS."""
        stats = next(iter((await self.client.stats()).values()))
        serving = stats.get("serving")
        if not isinstance(serving, dict):
            raise ConfigError(f"{self.address} is a pserver, not aps-serve: a predictor scores with what aps-serve serves")
        version = serving.get("version")
        return None if version is None else int(version)

    async def refresh(self) -> bool:
        """Load the dense tables of the version aps-serve serves now when it is not the one held;
        True when a new version was loaded. (A call that meets a new version loads it itself:
        refreshing ahead keeps that file read off the calls.)"""
        served = await self.served_version()
        return served is not None and await self._use(served)

    async def _use(self, version: int) -> bool:
        """Hold ``version``'s dense tables (read in a thread, copied in at once, on the loop)."""
        async with self._lock:
            if version == self.version:
                return False
            values = await asyncio.to_thread(read_dense, self.export_dir, version, self.dense_specs)
            await self._check_served(version, values)
            for name, value in values.items():
                np.copyto(self._dense[name], value)
            self.version = version
            self.versions_loaded.append(version)
            return True

    async def _check_served(self, version: int, values: Mapping[str, np.ndarray]) -> None:
        """The smallest dense table as aps-serve serves it must equal the one read: the export
        root given is the one aps-serve follows, not another root with the same versions."""
        if not values:
            return
        name = min(values, key=lambda n: values[n].size)
        served, at = await self.client.pull_dense(name, with_version=True)
        if at == version and not np.array_equal(served, values[name]):
            raise ConfigError(
                f"export root {self.export_dir}: its version {version} of dense table {name!r} is not the one aps-serve "
                f"at {self.address} serves: pass the export root aps-serve follows"
            )

    async def _check_tables(self) -> None:
        """Every Embedding table served, of the model's kind and shape."""
        for spec in self.sparse:
            served = await self.client.table_spec(spec.name)
            if type(served) is not type(spec) or table_shape(served) != table_shape(spec):
                raise ConfigError(
                    f"aps-serve at {self.address} serves table {spec.name!r} as {type(served).__name__} {table_shape(served)}, "
                    f"the model's is {type(spec).__name__} {table_shape(spec)}: build the model with the settings it was trained with"
                )

    # ------------------------------------------------------------ scoring

    def parse(self, lines: Iterable[str | bytes], labelled: bool = True) -> list[Batch]:
        """``lines`` as the model's batches (``model.batches``: one batch unless there are more
        lines than the model's ``batch_size``)."""
        chunk = _chunk(lines, 0 if labelled else getattr(self.model.format, "labels", 1))
        return [] if chunk is None else list(self.model.batches(chunk, self._ctx))

    async def score_lines(self, lines: Iterable[str | bytes], *, labelled: bool = True) -> np.ndarray:
        """The click probability of every line, float32 ``[len(lines)]``, in their order."""
        return await self.score_batches(self.parse(lines, labelled))

    async def score_batch(self, batch: Batch) -> np.ndarray:
        """Score a batch made by ``model.batches`` (or :meth:`parse`): its probabilities (also in
        ``batch.data.probs``), all from one model version (:attr:`version` after the call)."""
        return await self.score_batches([batch])

    async def score_batches(self, batches: Sequence[Batch]) -> np.ndarray:
        """The probabilities of every example of ``batches``, in order (a network with several
        tasks: the first task's, as ``model.predictions``), all from one model version. The
        rows of every batch and table are pulled together, each request in flight at once."""
        if not batches:
            return np.empty(0, np.float32)
        names = [spec.name for spec in self.sparse]
        for _ in range(_MAX_TRIES):
            calls = [self.client.pull_sparse(name, b.sparse_ids[name], with_version=True) for b in batches for name in names]
            pulled = [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)
            versions = {version for _, version in pulled}
            if None in versions:
                raise ConfigError(f"{self.address} answered without a model version: it is not aps-serve")
            if versions <= {self.version}:  # no await from here: the dense tables cannot change under the passes
                return self._forward(batches, names, [rows for rows, _ in pulled])
            await self._use(max(versions))  # type: ignore[type-var]
        raise ConfigError(f"aps-serve at {self.address} changed model version {_MAX_TRIES} times during one call")

    def _forward(self, batches: Sequence[Batch], names: list[str], rows: list[np.ndarray]) -> np.ndarray:
        """``model.forward`` over each batch with its pulled rows and the dense tables held."""
        out = []
        pulled = iter(rows)
        for batch in batches:
            self.model.forward_rows(batch, {name: next(pulled) for name in names}, self._dense)
            out.append(self.model.predictions(batch)[0])
        return out[0] if len(out) == 1 else np.concatenate(out)


async def score_files(
    model: TorchModel, serve: str | PSClient, export_dir: str | os.PathLike[str], files: Sequence[str], *,
    predictions: str | os.PathLike[str] | None = None, skip_bad_lines: bool = False, **options: Any,
) -> dict[str, Any]:
    """AUC, mean logloss and examples over ``files`` (read and batched as ``aps-trainer`` and
    ``infer.py`` read them, summed up as infer.py sums a checkpoint's: :func:`aps.models.ctr_eval.summarize`),
    scored through aps-serve (``infer.py --serve``), and the model versions used; ``predictions``:
    one probability a scored line written there, in order."""
    ctx = WorkerContext(0, 0, 1, 1, np.random.default_rng(0), skip_bad_lines=skip_bad_lines)
    versions: set[int | None] = set()
    out = open(predictions, "w") if predictions is not None else None

    async def scored(p: Predictor) -> AsyncIterator[tuple[np.ndarray, np.ndarray]]:
        for path in expand_inputs(list(files)):
            async for chunk in read_chunks(path, chunk_bytes=4 << 20):
                for batch in model.batches(chunk, ctx):
                    await p.score_batch(batch)
                    versions.add(p.version)
                    probs, labels = model.predictions(batch)
                    if out is not None:
                        out.write("".join(f"{x:.9g}\n" for x in probs.tolist()))
                    yield probs, labels

    try:
        async with Predictor.open(model, serve, export_dir, **options) as p:
            result = await summarize(scored(p), ctx, files)
    finally:
        if out is not None:
            out.close()
    return {**result, "model_versions": sorted(versions)}  # type: ignore[type-var]


def read_dense(root: str | os.PathLike[str], version: int, specs: Mapping[str, DenseTable]) -> dict[str, np.ndarray]:
    """The dense tables ``specs`` as model version ``version`` of the export root ``root`` has
    them, each in its shape: from export ``version`` (dense tables are whole in every export),
    or for a table it lacks the export it follows, and so on back to its base; read by
    aps-serve's own reader, every file checked against its manifest's SHA-256."""
    root = Path(root)
    done = {e.version: e for e in list_exports(root) if e.done}
    wanted = dict(specs)
    known = (*TABLE_SPECS, *{type(spec) for spec in specs.values()})  # the model's own kinds read back as themselves
    out: dict[str, np.ndarray] = {}
    at: int | None = version
    while wanted:
        entry = done.get(at) if at is not None else None
        if entry is None:
            where = f"version {version}" if at == version else f"version {at} (which version {version} follows)"
            raise ConfigError(f"export root {root} has no complete export of {where}: pass the export root aps-serve follows")
        manifest = read_manifest(entry.path)
        try:
            files = ExportFiles(entry.path, manifest)
            for name in [n for n in wanted if n in manifest["tables"]]:
                spec = spec_from_dict(manifest["tables"][name]["spec"], known)
                if type(spec) is not type(wanted[name]) or table_shape(spec) != table_shape(wanted[name]):
                    raise ConfigError(
                        f"export {entry.path}: table {name!r} is {_describe(spec)}, the model's is "
                        f"{_describe(wanted[name])}: build the model with the settings it was trained with"
                    )
                out[name] = files.dense_values(name, spec).reshape(spec.shape)
                del wanted[name]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"export {entry.path}: malformed ({type(exc).__name__}: {exc})") from exc
        at = manifest["previous_version"]
        if wanted and at is None:
            raise ConfigError(
                f"export root {root}: version {version} has no dense table {', '.join(map(repr, sorted(wanted)))}: "
                "another model's exports?"
            )
    return out


def _chunk(lines: Iterable[str | bytes], missing_labels: int) -> Chunk | None:
    """``lines`` as one chunk, ``missing_labels`` placeholder labels put before each."""
    parts = [line.encode() if isinstance(line, str) else bytes(line) for line in lines]
    if not parts:
        return None
    parts = [p[:-1] if p.endswith(b"\n") else p for p in parts]
    if missing_labels:
        prefix = b"0\t" * missing_labels
        parts = [prefix + p for p in parts]
    data = b"\n".join(parts) + b"\n"
    if data.count(b"\n") != len(parts):
        raise DataError("a line holds a newline: pass one example per line", "<lines>")
    return Chunk("<lines>", 1, data, len(parts))


def _describe(spec: Any) -> str:
    return f"{type(spec).__name__} {table_shape(spec)}"
