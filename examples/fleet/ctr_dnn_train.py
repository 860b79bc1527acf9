"""The reference's distributed CTR-DNN example as a user script run in every role.

    python examples/ctr_dnn/make_data.py --out data/ctr --scale small --train-lines 100000
    aps-local 2x2 -- python examples/fleet/ctr_dnn_train.py --data data/ctr/train_data --mode async --save model/ctr
    # incremental training: the pservers start from the saved tables
    aps-local 2x2 -- python examples/fleet/ctr_dnn_train.py --data data/ctr/train_data --init-model model/ctr
    # online: pass folders data/passes/<day>/<pass>/ (each complete with its _SUCCESS), a
    # checkpoint after each pass; after a crash --resume continues after the newest one
    aps-local 2x2 -- python examples/fleet/ctr_dnn_train.py --data-passes data/passes --save online/ctr --resume

Every trainer prints the loss of every step and, every --print-period steps, the AUC so far (the
reference's ``fetch_list=[auc_var]``); the first trainer saves at the end of each epoch, as the
reference's ``fleet.is_first_worker()`` does. With --data-passes each pass is an epoch, and the
first trainer saves ``--save``/pass-<seq> with the position in the pass folders after each;
each pass is predicted before it is trained, and its AUC printed (the online AUC).
"""

from __future__ import annotations

import argparse
import os

from ctr_reader import add_arguments, batches, optimizer_for, serve, strategy_for, table_args, train_files

from aps.fleet import Fleet
from aps.metrics import Auc
from aps.models.ctr_dnn.model import CtrDnn
from aps.trainer import PassDir
from aps.trainer.stepwise import StepTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, hidden="400,400,400", batch_size=1000, lr=0.001, online=True)
    parser.add_argument("--print-period", type=int, default=10, help="steps between AUC lines (default: %(default)s)")
    args = parser.parse_args()
    if args.data_passes and not args.save:
        parser.error("--data-passes needs --save: the pass checkpoints go there")

    fleet = Fleet()
    fleet.init()
    if fleet.is_server():
        serve(fleet, args)
        return

    model = CtrDnn(hidden=args.hidden, batch_size=args.batch_size, lr=args.lr, optimizer=optimizer_for(args),
                   meta=args.meta, **table_args(args))
    worker = fleet.init_worker(model, strategy_for(args))
    if args.data_passes:
        train_passes(fleet, worker, args)
    else:
        train_epochs(fleet, worker, args)
    fleet.stop_worker()


def train_pass(worker: StepTrainer, files: list[str], epoch: int, print_period: int) -> None:
    """One pass over ``files``: the loss of every step, the AUC so far every ``print_period``."""
    for batch in batches(worker, files):
        loss = worker.step(batch)
        print(f"epoch {epoch} step {worker.steps} loss {loss:.6f}", flush=True)
        if worker.steps % print_period == 0:
            print(f"epoch {epoch} step {worker.steps} auc {worker.auc():.4f}", flush=True)


def train_epochs(fleet: Fleet, worker: StepTrainer, args: argparse.Namespace) -> None:
    files = train_files(fleet, args.data)
    print(f"trainer {fleet.worker_index()} of {fleet.worker_num()}: {len(files)} files", flush=True)
    for epoch in range(args.epochs):
        train_pass(worker, files, epoch, args.print_period)
        record = worker.end_epoch()
        print(f"epoch {epoch} finished: {record['examples']} examples, loss {record['loss']:.6f}, "
              f"auc {record.get('auc', float('nan')):.4f}, {record['examples_per_s']:.0f} examples/s", flush=True)
        if args.save and fleet.is_first_worker():
            worker.save(os.path.join(args.save, f"epoch_{epoch}"))


def train_passes(fleet: Fleet, worker: StepTrainer, args: argparse.Namespace) -> None:
    """Online: every pass once, in order; asking for the next pass ends this one and saves it."""
    source = PassDir(args.data_passes, trainer_id=fleet.worker_index(), num_trainers=fleet.worker_num(),
                     wait=args.pass_wait)
    for p in worker.passes(source, save_dir=args.save, resume=args.resume):
        print(f"pass {p.name} (seq {p.seq}): {len(p.files)} files", flush=True)
        auc = Auc()  # predict, then train: the online AUC, the model's score on data it has not seen
        for batch in batches(worker, p.files):
            if (predicted := worker.predict(batch)) is not None:
                auc.update(*predicted)
        print(f"pass {p.name} online auc {auc.global_auc():.4f}", flush=True)
        train_pass(worker, p.files, worker.epoch, args.print_period)
    print(f"passes stopped: {source.stop_reason}; {len(worker.records)} trained"
          + (f", resumed from {worker.resumed_from}" if worker.resumed_from else ""), flush=True)


if __name__ == "__main__":
    main()
