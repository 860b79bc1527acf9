"""DataGenerator: Paddle-style user preprocessing scripts producing MultiSlot text."""

from __future__ import annotations

import io
import shlex
import sys
import textwrap
import zlib

import numpy as np
import pytest

from aps.errors import ConfigError, DataError
from aps.trainer.datagen import DataGenerator
from aps.trainer.multislot import MultiSlotFormat, Slot
from aps.trainer.reader import read_chunks


class PaddleStyle(DataGenerator):
    """generate_sample returns a local reader() function, yielding zip(...) like Paddle's example."""

    def generate_sample(self, line):
        def reader():
            fields = line.rstrip("\n").split(",")
            label, values = int(fields[0]), [float(v) for v in fields[1:]]
            yield zip(["label", "dense"], [[label], values])

        return reader


class GeneratorStyle(DataGenerator):
    """generate_sample is itself a generator; one input line may give several samples, or none."""

    def generate_sample(self, line):
        for word in line.split():
            if word == "skip":
                yield None
            else:
                yield [("word", [len(word)]), ("chars", [ord(c) for c in word])]


def test_paddle_style_reader_function():
    out = list(PaddleStyle().generate_lines(["1,0.5,2\n", "0,-1.25\n"]))
    assert out == ["1 1 2 0.5 2.0\n", "1 0 1 -1.25\n"]


def test_generator_style_and_none_samples():
    gen = GeneratorStyle()
    out = list(gen.generate_lines(["ab skip c\n", "\n", "xyz\n"]))
    assert out == ["1 2 2 97 98\n", "1 1 1 99\n", "1 3 3 120 121 122\n"]
    assert gen.slot_names == ("word", "chars")


def test_slot_order_fixed_by_first_sample():
    class Flipping(DataGenerator):
        def generate_sample(self, line):
            def reader():
                pair = [("a", [1]), ("b", [2])]
                yield pair if line.strip() != "flip" else pair[::-1]

            return reader

    gen = Flipping()
    with pytest.raises(DataError) as info:
        list(gen.generate_lines(["x\n", "y\n", "flip\n"], source="input.txt"))
    assert info.value.file == "input.txt" and info.value.line == 3
    assert "['b', 'a']" in str(info.value)


def test_bad_values_name_the_input_line():
    with pytest.raises(DataError) as info:
        list(PaddleStyle().generate_lines(["1,2\n", "1,nan\n"]))
    assert info.value.line == 2 and "not finite" in str(info.value)


def test_generate_sample_must_return_a_reader():
    class Wrong(DataGenerator):
        def generate_sample(self, line):
            return 42

    with pytest.raises(ConfigError, match="reader function"):
        list(Wrong().generate_lines(["x\n"]))
    with pytest.raises(NotImplementedError):
        list(DataGenerator().generate_lines(["x\n"]))


def test_run_from_stdin_and_memory_with_streams():
    out = io.StringIO()
    PaddleStyle().run_from_stdin(io.StringIO("1,3\n0,4.5\n"), out)
    assert out.getvalue() == "1 1 1 3.0\n1 0 1 4.5\n"

    class Memory(DataGenerator):
        def generate_sample(self, line):
            assert line is None

            def reader():
                for k in range(3):
                    yield [("k", [k])]

            return reader

    out = io.StringIO()
    Memory().run_from_memory(out)
    assert out.getvalue() == "1 0\n1 1\n1 2\n"


CRITEO_GENERATOR = '''
    """A Criteo preprocessing script in Paddle's style (dataset_generator.py), on aps."""
    import zlib
    from aps.trainer.datagen import DataGenerator

    CONT_MIN = [0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    CONT_DIFF = [20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50]
    HASH_DIM = 1000001


    class CriteoDataset(DataGenerator):
        def generate_sample(self, line):
            def reader():
                features = line.rstrip("\\n").split("\\t")
                dense = [0.0 if features[i] == "" else (float(features[i]) - CONT_MIN[i - 1]) / CONT_DIFF[i - 1]
                         for i in range(1, 14)]
                # a stable hash: Python's hash() is salted per process, so two trainers would disagree
                sparse = [[zlib.crc32((str(i) + features[i]).encode()) % HASH_DIM] for i in range(14, 40)]
                names = ["label", "dense_feature"] + ["C" + str(i - 13) for i in range(14, 40)]
                yield zip(names, [[int(features[0])], dense] + sparse)
            return reader


    if __name__ == "__main__":
        CriteoDataset().run_from_stdin()
'''


def raw_criteo_lines(n: int, rng: np.random.Generator) -> list[str]:
    lines = []
    for _ in range(n):
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(0, 100))) for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{int(rng.integers(0, 2**32)):08x}" for _ in range(26)]
        lines.append("\t".join([str(int(rng.integers(0, 2)))] + ints + cats) + "\n")
    return lines


async def test_generator_script_as_pipe_command(tmp_path):
    script = tmp_path / "criteo_gen.py"
    script.write_text(textwrap.dedent(CRITEO_GENERATOR))
    raw = raw_criteo_lines(300, np.random.default_rng(3))
    data = tmp_path / "part-0"
    data.write_text("".join(raw))

    fmt = MultiSlotFormat(
        [Slot("label", "int64"), Slot("dense_feature", "float32")] + [Slot(f"C{k}", "int64") for k in range(1, 27)]
    )
    labels, dense, c1, lines = [], [], [], 0
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    async for chunk in read_chunks(str(data), 4096, command):
        batch = fmt.parse(chunk)
        lines += batch.num_lines
        labels += batch.slots["label"][0].tolist()
        dense.append(batch.slots["dense_feature"][0])
        c1 += batch.slots["C1"][0].tolist()
    assert lines == 300
    fields = [r.rstrip("\n").split("\t") for r in raw]
    assert labels == [int(f[0]) for f in fields]
    assert c1 == [zlib.crc32(("14" + f[14]).encode()) % 1000001 for f in fields]
    first_dense = [0.0 if v == "" else (float(v) - m) / d for v, m, d in zip(fields[0][1:14],
                   [0, -3] + [0] * 11, [20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50])]
    np.testing.assert_array_equal(np.concatenate(dense)[:13], np.array(first_dense, dtype=np.float32))


async def test_failing_generator_script_reports_its_error(tmp_path):
    script = tmp_path / "bad_gen.py"
    script.write_text(textwrap.dedent('''
        from aps.trainer.datagen import DataGenerator
        class G(DataGenerator):
            def generate_sample(self, line):
                def reader():
                    yield [("a", [1])] if "flip" not in line else [("b", [1])]
                return reader
        G().run_from_stdin()
    '''))
    data = tmp_path / "in"
    data.write_text("x\ny\nflip\n")
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    with pytest.raises(DataError) as info:
        async for _ in read_chunks(str(data), 4096, command):
            pass
    assert info.value.file == str(data)
    assert "<stdin>:3" in str(info.value) and "differ from the first sample" in str(info.value)
