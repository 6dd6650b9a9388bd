#!/usr/bin/env bash
# Brings a fresh machine to the queue: the repository's environment, the data extracted from
# ../shared/data, the runs an earlier machine carried (queue_carry.sh), and two queue workers
# (queue_worker.sh) in the background, one thread each.
# Run from the repository's root: bash docs/results/cifar100/queue_start.sh
set -eu
REPO=$(pwd); RUNS=${RUNS:-/work/runs43}; DATA=${DATA:-/tmp/data}; SHARED=${SHARED:-$REPO/../shared}
here=$(dirname "$0")
[[ -x .venv/bin/python ]] || { python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'; }
mkdir -p "$DATA"
for name in cifar10 cifar100 tiny-imagenet-200; do
  [[ -d $DATA/$name ]] || tar xzf "$SHARED/data/$name-train.tar.gz" -C "$DATA"
done
mkdir -p "$RUNS/claims"
# Runs an earlier machine carried (queue_carry.sh) go back where the workers resume them.
for carried in "$here"/carry/*/; do
  [[ -d $carried && ! -e $RUNS/$(basename "$carried") ]] && cp -rp "${carried%/}" "$RUNS/"
done
# Claims outlive workers killed with the machine: without a worker left, none is live, and the
# runs they name are resumed from their checkpoints.
pgrep -f "$RUNS/worker.sh" > /dev/null || find "$RUNS/claims" -mindepth 1 -maxdepth 1 -type d -exec rmdir {} +
cp "$here/queue_worker.sh" "$RUNS/worker.sh" && chmod +x "$RUNS/worker.sh"
[[ -f $RUNS/queue.txt ]] || cp "$here/queue.txt" "$RUNS/queue.txt"
rm -f "$RUNS/STOP"
for i in 1 2; do
  RUNS=$RUNS REPO=$REPO DATA=$DATA setsid nohup "$RUNS/worker.sh" >> "$RUNS/worker_$i.log" 2>&1 < /dev/null &
  sleep 3
done
echo "two workers on $RUNS/queue.txt; their log: $RUNS/worker_*.log; stop them after their runs: touch $RUNS/STOP"
