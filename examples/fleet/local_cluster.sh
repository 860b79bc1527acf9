#!/usr/bin/env bash
# The reference's local_cluster.sh flow for an aps.fleet script: start N pservers and M trainers
# of one program on this machine, each a background process whose role is in its environment
# (Paddle's Fleet names, which aps.fleet reads), logs in $LOG_DIR/, then wait for the trainers
# and for the pservers, which exit by themselves once every trainer called stop_worker.
#
# Moving a reference script over changes only the program (and its arguments):
#   PROGRAM="examples/fleet/ctr_dnn_train.py --data data/ctr/train_data --mode async" \
#       bash examples/fleet/local_cluster.sh
#
# Settings (environment): PROGRAM, PYTHON (default python), PSERVER_PORTS (comma-separated,
# default 36011,36012: one pserver per port), TRAINERS (default 2), LOG_DIR (default log),
# SERVER_GRACE (seconds the pservers may take to exit after the trainers, default 30).
# Unlike a bare script, this one fails fast: when a role fails, it stops the others, shows the
# failed role's log tail and exits 1; Ctrl-C stops every role. aps-local / aps-launch do all of
# this and more (free ports, status line, summary); this script shows the reference's flow.
set -u

PROGRAM=${PROGRAM:-"examples/fleet/ctr_dnn_train.py --data data/ctr/train_data"}
PYTHON=${PYTHON:-python}
PSERVER_PORTS=${PSERVER_PORTS:-36011,36012}
TRAINERS=${TRAINERS:-2}
LOG_DIR=${LOG_DIR:-log}
SERVER_GRACE=${SERVER_GRACE:-30}
mkdir -p "$LOG_DIR"

IFS=, read -r -a ports <<< "$PSERVER_PORTS"
endpoints=""
for port in "${ports[@]}"; do
    endpoints="${endpoints:+$endpoints,}127.0.0.1:$port"
done

# shared by every role
export PADDLE_PSERVERS_IP_PORT_LIST=$endpoints
export PADDLE_TRAINERS_NUM=$TRAINERS
export PYTHONUNBUFFERED=1

declare -A name_of reaped
pserver_pids=()
trainer_pids=()

stop_all() {
    for pid in "${pserver_pids[@]}" "${trainer_pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    wait 2>/dev/null
}
trap 'echo "local_cluster.sh: interrupted, stopping every role" >&2; stop_all; exit 130' INT TERM

# pservers: TRAINING_ROLE=PSERVER, their own address in POD_IP and PADDLE_PORT
for i in "${!ports[@]}"; do
    TRAINING_ROLE=PSERVER POD_IP=127.0.0.1 PADDLE_PORT=${ports[$i]} \
        $PYTHON $PROGRAM > "$LOG_DIR/pserver.$i.log" 2>&1 &
    pserver_pids+=($!)
    name_of[$!]="pserver.$i"
    echo "local_cluster.sh: pserver.$i on 127.0.0.1:${ports[$i]}, log $LOG_DIR/pserver.$i.log"
done

# trainers: TRAINING_ROLE=TRAINER and their index in PADDLE_TRAINER_ID
for ((i = 0; i < TRAINERS; i++)); do
    TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=$i \
        $PYTHON $PROGRAM > "$LOG_DIR/trainer.$i.log" 2>&1 &
    trainer_pids+=($!)
    name_of[$!]="trainer.$i"
    echo "local_cluster.sh: trainer.$i, log $LOG_DIR/trainer.$i.log"
done

fail() {
    echo "local_cluster.sh: FAILED: $1 (log: $LOG_DIR/$2.log)" >&2
    tail -n 10 "$LOG_DIR/$2.log" >&2
    stop_all
    exit 1
}

# every role until the trainers are done: the first one to exit non-zero fails the job
running=$TRAINERS
while ((running > 0)); do
    wait -n -p pid
    code=$?
    [[ -z "${pid:-}" ]] && break
    role=${name_of[$pid]}
    ((code != 0)) && fail "$role exited with status $code" "$role"
    echo "local_cluster.sh: $role finished"
    reaped[$pid]=1
    # a pserver exits 0 right after the last trainer's stop_worker, maybe before we see that
    # trainer exit; one that leaves early makes the trainers fail, which fails the job above
    [[ $role == trainer.* ]] && ((running--))
done

# then the pservers, which exit once every trainer has called stop_worker
deadline=$((SECONDS + SERVER_GRACE))
for pid in "${pserver_pids[@]}"; do
    [[ -n "${reaped[$pid]:-}" ]] && continue
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && fail "${name_of[$pid]} still running ${SERVER_GRACE} s after the trainers" "${name_of[$pid]}"
    wait "$pid" || fail "${name_of[$pid]} exited with status $?" "${name_of[$pid]}"
    echo "local_cluster.sh: ${name_of[$pid]} finished"
done
echo "local_cluster.sh: every role exited 0"
