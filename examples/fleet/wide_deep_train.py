"""The reference's Fleet quick start (wide&deep) as a user script run in every role.

    python examples/ctr_dnn/make_data.py --out data/ctr --scale small --train-lines 100000
    aps-local 1x2 -- python examples/fleet/wide_deep_train.py --data data/ctr/train_data --mode sync
    aps-launch --server-num 1 --worker-num 2 examples/fleet/wide_deep_train.py --data data/ctr/train_data

The same file runs as the pserver and as each trainer; the environment says which. Each step
prints the reference's line ``TRAIN ---> pass: P step: S loss: L``.
"""

from __future__ import annotations

import argparse

from ctr_reader import add_arguments, batches, optimizer_for, serve, strategy_for, table_args, train_files

from aps.fleet import Fleet
from aps.models.wide_deep.model import WideDeep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, hidden="400,400,400", batch_size=4, lr=0.0001)
    args = parser.parse_args()

    fleet = Fleet()
    fleet.init()  # role from the environment (PaddleCloudRoleMaker)
    strategy = strategy_for(args)

    if fleet.is_server():
        serve(fleet, args)
        return

    model = WideDeep(hidden=args.hidden, batch_size=args.batch_size, lr=args.lr, optimizer=optimizer_for(args),
                     meta=args.meta, **table_args(args))
    worker = fleet.init_worker(model, strategy)
    files = train_files(fleet, args.data)
    for epoch in range(args.epochs):
        for batch in batches(worker, files):
            loss = worker.step(batch)
            print(f"TRAIN ---> pass: {epoch} step: {worker.steps} loss: {loss:.6f}", flush=True)
        worker.end_epoch()
    if args.save and fleet.is_first_worker():
        worker.save(args.save)
    fleet.stop_worker()


if __name__ == "__main__":
    main()
