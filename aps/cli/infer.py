"""The command line of the CTR examples' ``infer.py``: checkpoint + test files -> AUC, logloss.

With ``--serve HOST:PORT --export DIR`` instead of ``--checkpoint`` (an aps.torch model), the
parameters are those aps-serve serves: sparse rows pulled from it, dense tables read from the
export root it follows (:class:`aps.torch.predictor.Predictor`); ``--predictions OUT`` writes
one click probability per scored line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from ..errors import ApsError, ConfigError
from ..models import build_model
from ..models.ctr_eval import evaluate, load_params


#: aps-infer's help
DESCRIPTION = """Score test files with a trained model: AUC, logloss and examples (aps-infer).

    aps-infer --model deepfm --model-arg meta=data/adult/meta.json --checkpoint model/epoch_4 --data data/adult/test_data
    aps-infer --model my_net.py:build --checkpoint model/epoch_4 --data test

The model is named as aps-trainer's --model (a built-in name, module:Class or file.py:function),
with the --model-arg values it was trained with. The checkpoint may come from any number of
pservers; --serve HOST:PORT --export DIR scores with what an aps-serve serves instead."""


def build_parser(model: str | None, description: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a checkpoint directory saved by the pservers (e.g. model/ctr/epoch_0)")
    source.add_argument("--serve", metavar="HOST:PORT", help="score with what this aps-serve serves (an aps.torch model; needs --export)")
    p.add_argument("--export", metavar="DIR", help="with --serve: the export root aps-serve follows (dense tables are read there)")
    p.add_argument("--predictions", metavar="OUT", help="with --serve: write one click probability per scored line to OUT")
    p.add_argument("--token-file", metavar="PATH", help="with --serve: aps-serve's token (or APS_TOKEN)")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="test files, directories or globs")
    if model is None:
        p.add_argument("--model", required=True, help="model name, module:Class or file.py:function, as aps-trainer's")
    else:
        p.add_argument("--model", default=model, help=f"model name or module:Class (default {model})")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="model argument used in training (repeatable)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of failing")
    p.add_argument("--json", metavar="OUT", help='also write {"auc": ..., "logloss": ..., "examples": ...} to OUT')
    return p


def cli() -> int:
    """aps-infer: no default model."""
    return main(None, DESCRIPTION)


def main(model: str | None, description: str | None = None, argv: list[str] | None = None) -> int:
    parser = build_parser(model, description)
    args = parser.parse_args(argv)
    if args.serve and not args.export:
        parser.error("--serve needs --export DIR, the export root aps-serve follows")
    if not args.serve and (args.export or args.predictions or args.token_file):
        parser.error("--export, --predictions and --token-file go with --serve")
    for option, path in (("--json", args.json), ("--predictions", args.predictions)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            print(f"infer: error: {option} {path}: its directory does not exist", file=sys.stderr)
            return 2
    started = time.monotonic()
    try:
        net = build_model(args.model, args.model_arg)
        if args.serve:
            result = _score_served(net, args)
        else:
            result = evaluate(net, load_params(net, args.checkpoint), args.data, skip_bad_lines=args.skip_bad_lines)
    except ApsError as exc:
        print(f"infer: error: {exc}", file=sys.stderr)
        return 2
    result["seconds"] = round(time.monotonic() - started, 3)
    versions = f"  model versions {result['model_versions']}" if args.serve else ""
    print(f"AUC {result['auc']:.6f}  logloss {result['logloss']:.6f}  examples {result['examples']}  ({result['seconds']} s){versions}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
            f.write("\n")
    return 0


def _score_served(net: Any, args: argparse.Namespace) -> dict[str, Any]:
    """--serve: every line scored by aps.torch's Predictor (torch is imported only here)."""
    try:
        from ..torch import TorchModel
        from ..torch.predictor import score_files
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(net, TorchModel):
        raise ConfigError(f"--serve scores aps.torch models; {args.model} is not one (examples/online/predict.py scores the built-in ones)")
    try:
        token = open(args.token_file).read().rstrip("\r\n") if args.token_file else os.environ.get("APS_TOKEN")
        return asyncio.run(score_files(net, args.serve, args.export, args.data, predictions=args.predictions, token=token,
                                       skip_bad_lines=args.skip_bad_lines))
    except OSError as exc:  # the token file, or --predictions' file
        raise ConfigError(str(exc)) from None
