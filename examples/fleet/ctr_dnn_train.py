"""The reference's distributed CTR-DNN example as a user script run in every role.

    python examples/ctr_dnn/make_data.py --out data/ctr --scale small --train-lines 100000
    aps-local 2x2 -- python examples/fleet/ctr_dnn_train.py --data data/ctr/train_data --mode async --save model/ctr
    # incremental training: the pservers start from the saved tables
    aps-local 2x2 -- python examples/fleet/ctr_dnn_train.py --data data/ctr/train_data --init-model model/ctr

Every trainer prints the loss of every step and, every --print-period steps, the AUC so far (the
reference's ``fetch_list=[auc_var]``); the first trainer saves at the end of each epoch, as the
reference's ``fleet.is_first_worker()`` does.
"""

from __future__ import annotations

import argparse
import os

from ctr_reader import add_arguments, batches, optimizer_for, serve, strategy_for, table_args, train_files

from aps.fleet import Fleet
from aps.models.ctr_dnn.model import CtrDnn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, hidden="400,400,400", batch_size=1000, lr=0.001)
    parser.add_argument("--print-period", type=int, default=10, help="steps between AUC lines (default: %(default)s)")
    args = parser.parse_args()

    fleet = Fleet()
    fleet.init()
    if fleet.is_server():
        serve(fleet, args)
        return

    model = CtrDnn(hidden=args.hidden, batch_size=args.batch_size, lr=args.lr, optimizer=optimizer_for(args),
                   meta=args.meta, **table_args(args))
    worker = fleet.init_worker(model, strategy_for(args))
    files = train_files(fleet, args.data)
    print(f"trainer {fleet.worker_index()} of {fleet.worker_num()}: {len(files)} files", flush=True)
    for epoch in range(args.epochs):
        for batch in batches(worker, files):
            loss = worker.step(batch)
            print(f"epoch {epoch} step {worker.steps} loss {loss:.6f}", flush=True)
            if worker.steps % args.print_period == 0:
                auc = worker.auc()
                print(f"epoch {epoch} step {worker.steps} auc {auc:.4f}", flush=True)
        record = worker.end_epoch()
        print(f"epoch {epoch} finished: {record['examples']} examples, loss {record['loss']:.6f}, "
              f"auc {record.get('auc', float('nan')):.4f}, {record['examples_per_s']:.0f} examples/s", flush=True)
        if args.save and fleet.is_first_worker():
            worker.save(os.path.join(args.save, f"epoch_{epoch}"))
    fleet.stop_worker()


if __name__ == "__main__":
    main()
