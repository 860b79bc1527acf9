#!/bin/bash
# The same job under Open MPI:  bash examples/slurm/mpirun.sh
# Ranks come from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE; MPI does not say where the other
# ranks run, so the pserver list is given: pserver k at the host of rank k, port APS_BASE_PORT+k.
# With the hostfile below and --map-by node, rank 0 lands on host1 and rank 1 on host2.
set -euo pipefail
APS_HOME=${APS_HOME:-$HOME/aps}
cat > /tmp/aps-hosts <<HOSTS
host1 slots=2
host2 slots=2
HOSTS
mpirun -np 4 --hostfile /tmp/aps-hosts --map-by node \
    -x APS_NUM_PSERVERS=2 -x APS_BASE_PORT=7164 -x APS_PSERVERS=host1:7164,host2:7165 -x PATH \
    "$APS_HOME/.venv/bin/python" "$APS_HOME/examples/slurm/run_rank.py" -- \
    --model word2vec --data "$APS_HOME/data/word2vec/train" --mode geo --epochs 1 --no-save
