#!/usr/bin/env python3
"""Write training data for the linear-regression example model (examples/linreg/model.py).

Labels follow y = b* + sum(w*[f]) exactly, so a trained model can be checked against the known
optimum. Then train it on a local cluster:

    python examples/linreg/make_data.py data/linreg
    PYTHONPATH=. aps-local 1x2 --mode async -- --model examples.linreg.model:LinReg --data data/linreg --epochs 3

(from the repository root; the tests load the model by that module name too, and numba's cache of
its compiled kernels must see one name per file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model import make_data  # this directory is on sys.path when the script runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="directory for the part-NNN files")
    parser.add_argument("--files", type=int, default=4, help="number of files (default 4)")
    parser.add_argument("--lines", type=int, default=2000, help="lines per file (default 2000)")
    parser.add_argument("--features", type=int, default=200, help="number of binary features (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.files < 1 or args.lines < 1 or args.features < 5:
        parser.error("need --files >= 1, --lines >= 1 and --features >= 5 (a line has up to 5 features)")
    w, b = make_data(args.out, args.files, args.lines, args.features, args.seed)
    print(f"wrote {args.files} x {args.lines} lines to {args.out}/ (optimum: b = {b}, |w| = {len(w)} weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
