"""The command line of the CTR examples' ``infer.py``: checkpoint + test files -> AUC, logloss."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..errors import ApsError
from ..models import build_model
from ..models.ctr_eval import evaluate, load_params


def build_parser(model: str, description: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a checkpoint directory saved by the pservers (e.g. model/ctr/epoch_0)")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="test files, directories or globs")
    p.add_argument("--model", default=model, help=f"model name or module:Class (default {model})")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="model argument used in training (repeatable)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of failing")
    p.add_argument("--json", metavar="OUT", help='also write {"auc": ..., "logloss": ..., "examples": ...} to OUT')
    return p


def main(model: str, description: str | None = None, argv: list[str] | None = None) -> int:
    args = build_parser(model, description).parse_args(argv)
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        print(f"infer: error: --json {args.json}: its directory does not exist", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        net = build_model(args.model, args.model_arg)
        result = evaluate(net, load_params(net, args.checkpoint), args.data, skip_bad_lines=args.skip_bad_lines)
    except ApsError as exc:
        print(f"infer: error: {exc}", file=sys.stderr)
        return 2
    result["seconds"] = round(time.monotonic() - started, 3)
    print(f"AUC {result['auc']:.6f}  logloss {result['logloss']:.6f}  examples {result['examples']}  ({result['seconds']} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
            f.write("\n")
    return 0
