"""Evaluate a trained CTR-DNN checkpoint on test files: AUC, logloss, examples.

    python examples/ctr_dnn/infer.py --checkpoint model/ctr/epoch_0 --data data/ctr/test_data

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
    sys.exit(main("ctr_dnn", __doc__))
