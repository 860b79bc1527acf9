"""Evaluate a trained wide&deep checkpoint on test files: AUC, logloss, examples.

    python examples/wide_deep/infer.py --checkpoint model/adult/epoch_4 --data data/adult/test_data --model-arg meta=data/adult/meta.json

The checkpoint may have been saved by any number of pservers. Pass the same ``--model-arg``
values the model was trained with (a mismatch is reported, not guessed). The AUC state starts
from zero (the reference's set_zero step), so the number is the test files' alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from aps.cli.infer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("wide_deep", __doc__))
