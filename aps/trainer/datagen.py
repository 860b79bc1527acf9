"""User-side preprocessing scripts, like Paddle's ``fleet.data_generator.MultiSlotDataGenerator``.

A user turns raw records (a Criteo TSV line, say) into MultiSlot samples by subclassing
:class:`DataGenerator` and writing ``generate_sample``. The script ends with
``MyGenerator().run_from_stdin()``; then

* ``cat part-0 | python my_gen.py`` shows exactly what the trainer will parse, and
* ``--pipe-command "python my_gen.py"`` makes every reader run it over its files
  (:func:`aps.trainer.reader.read_chunks`), keeping arbitrary Python preprocessing out of the
  trainer's event loop and workers.

Paddle's convention is kept: ``generate_sample(line)`` returns a local function ``reader()``
whose calls yield samples ``[(slot_name, [values...]), ...]`` (``zip(names, values)`` works, and
a ``None`` sample is skipped). Writing ``generate_sample`` itself as a generator is accepted too.
Unlike Paddle, an empty value list is allowed (the aps parser reads size-0 slots), and samples
whose slot names or order differ from the first sample's are an error with the input line
number, not a silently shifted column.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ..errors import ConfigError, DataError
from .multislot import format_multislot

Sample = Iterable[tuple[str, Any]]


class DataGenerator:
    """Base class: subclass it and implement :meth:`generate_sample`."""

    def __init__(self) -> None:
        self._slot_names: tuple[str, ...] | None = None

    @property
    def slot_names(self) -> tuple[str, ...] | None:
        """Slot order fixed by the first sample (``None`` before any sample)."""
        return self._slot_names

    def generate_sample(self, line: str | None) -> Callable[[], Iterable[Sample | None]] | Iterable[Sample | None]:
        """Turn one input line (with its trailing newline, as read) into samples.

        Return a reader function that yields samples (Paddle's style), or be a generator.
        """
        raise NotImplementedError("subclasses implement generate_sample(line)")

    def _samples(self, line: str | None) -> Iterable[Sample | None]:
        result = self.generate_sample(line)
        if result is None:
            return ()
        if isinstance(result, Iterator):  # generate_sample was written as a generator
            return result
        if callable(result):
            return result()
        raise ConfigError(
            f"{type(self).__name__}.generate_sample must return a reader function or be a generator, "
            f"got {type(result).__name__}"
        )

    def _format(self, sample: Sample, source: str, line_no: int) -> str:
        try:
            items = list(sample)
            names = tuple(item[0] for item in items)
        except (TypeError, IndexError):
            raise DataError(f"a sample must be a sequence of (slot_name, values) pairs, got {sample!r}",
                            source, line_no) from None
        if self._slot_names is None:
            if len(set(names)) != len(names):
                raise DataError(f"sample repeats a slot name: {list(names)}", source, line_no)
            self._slot_names = names
        elif names != self._slot_names:
            raise DataError(
                f"sample slots {list(names)} differ from the first sample's {list(self._slot_names)}",
                source, line_no,
            )
        try:
            return format_multislot(items)
        except DataError as exc:
            raise DataError(str(exc), source, line_no) from None

    def generate_lines(self, lines: Iterable[str], source: str = "<memory>") -> Iterator[str]:
        """MultiSlot text lines (each ending in ``"\\n"``) for the input ``lines``.

        ``source`` names the input in error messages; line numbers are 1-based input lines.
        """
        for line_no, line in enumerate(lines, 1):
            for sample in self._samples(line):
                if sample is not None:
                    yield self._format(sample, source, line_no) + "\n"

    def run_from_stdin(self, stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> None:
        """Read lines from stdin, write MultiSlot lines to stdout (the pipe-command entry point).

        Nothing else may be printed to stdout — it is the data stream; log to stderr instead.
        """
        src = sys.stdin if stdin is None else stdin
        dst = sys.stdout if stdout is None else stdout
        write = dst.write
        for text in self.generate_lines(src, "<stdin>"):
            write(text)
        dst.flush()

    def run_from_memory(self, stdout: IO[str] | None = None) -> None:
        """Paddle's in-memory mode: ``generate_sample(None)`` produces all samples itself."""
        dst = sys.stdout if stdout is None else stdout
        for sample in self._samples(None):
            if sample is not None:
                dst.write(self._format(sample, "<memory>", 1) + "\n")
        dst.flush()
