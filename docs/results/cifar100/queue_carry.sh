#!/usr/bin/env bash
# Before a session ends: carries the queue's unfinished runs to the next machine through git.
# Stops the workers (STOP) and their trainings (SIGTERM: a run saves its checkpoint as it stops),
# then copies each unfinished run folder that holds a checkpoint, up to 8 MiB, into
# docs/results/cifar100/carry/VARIANT/ (all but its lock) to be committed; queue_start.sh puts
# them back in the runs folder, where the workers resume them. A larger run starts over.
# Run from the repository's root: bash docs/results/cifar100/queue_carry.sh
set -eu
REPO=$(pwd); RUNS=${RUNS:-/work/runs43}
carry=$REPO/docs/results/cifar100/carry
limit=$((8 * 1024 * 1024))
touch "$RUNS/STOP"
pkill -TERM -f -- "-m ssog train .*$RUNS/" || true
while pgrep -f -- "-m ssog train .*$RUNS/" > /dev/null; do sleep 2; done
while pgrep -f "$RUNS/worker.sh" > /dev/null; do sleep 2; done
for run in "$RUNS"/*/; do
  run=${run%/}; variant=$(basename "$run")
  [[ -f $run/last.safetensors && ! -f $run/summary.json ]] || continue
  size=$(du -sb --exclude=.ssog-run.lock "$run" | cut -f1)
  if (( size > limit )); then
    echo "$variant: $((size / 1024 / 1024)) MiB, over the carry's 8 MiB: it starts over on the next machine"
    continue
  fi
  rm -rf "$carry/$variant" && mkdir -p "$carry/$variant"
  find "$run" -maxdepth 1 -type f ! -name .ssog-run.lock -exec cp -p {} "$carry/$variant/" \;
  echo "$variant: carried ($(cat "$run/log.jsonl" 2>/dev/null | wc -l) epochs logged)"
done
echo "commit $carry; on the next machine: bash docs/results/cifar100/queue_start.sh"
