#!/usr/bin/env bash
# A queue worker: takes the first line of queue.txt ("COMMIT CONFIG VARIANT[+TAG] PAGE [ARGS...]")
# whose run is neither finished (its summary archived under docs/results/PAGE/runs/, or in its
# run folder) nor claimed by another worker, trains it from a checkout of COMMIT (made on first
# use; a run folder that holds a checkpoint is resumed), copies its config, log and summary into
# docs/results/PAGE/runs/VARIANT/ (a 15-epoch row's weights, if small, into PAGE/weights/), and
# takes the next. Idles while the queue has nothing; stops when the file STOP exists in the runs
# folder.
#   RUNS (default /work/runs43): run folders, queue.txt, claims; REPO (/work/main): the
#   repository and its .venv; FROZEN (/work/frozen): the checkouts; DATA (/tmp/data): the data.
set -u
RUNS=${RUNS:-/work/runs43}; REPO=${REPO:-/work/main}; FROZEN=${FROZEN:-/work/frozen}; DATA=${DATA:-/tmp/data}
PY=$REPO/.venv/bin/python
cd "$RUNS" && mkdir -p claims "$FROZEN"

archived() { [[ -f $REPO/docs/results/$2/runs/$1/summary.json ]]; }
checkout() {  # COMMIT -> the folder of a detached checkout of it, made once (a lock for two workers)
  local dir=$FROZEN/$1
  if [[ ! -d $dir ]]; then
    until mkdir "$FROZEN/.lock" 2>/dev/null; do sleep 2; done
    [[ -d $dir ]] || git -C "$REPO" worktree add --detach "$dir" "$1" >&2
    rmdir "$FROZEN/.lock"
  fi
  echo "$dir"
}
release() {  # VARIANT PAGE COMMIT: a finished row's final weights in timm's hub layout, in PAGE/weights/
  # (a run folder does not outlive its machine). 5-epoch checks are not releases, and weights over
  # 1 MiB in float32 stay out of git (tests/contract/test_released_weights.py). A `+rerun` repeats
  # its row (same commit, config and seed) and releases under the row's name; other tags add a
  # setting or seed and keep theirs (`+seed1` -> VARIANT_seed1).
  local release_name=${1%+rerun}
  local dest=$REPO/docs/results/$2/weights/${release_name//+/_} params
  [[ $1 == sweep_* || -e $dest ]] && return 0
  params=$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["params"])' "$RUNS/$1/summary.json")
  (( params * 4 <= 1048576 )) || return 0
  (cd "$(checkout "$3")" && PYTHONPATH=$PWD/src $PY -m ssog export --checkpoint "$RUNS/$1/last.safetensors" --format hf --output "$dest")
}
archive() {  # VARIANT PAGE COMMIT: the finished run's record (and release), beside its results page;
  # a copy an earlier machine carried (queue_carry.sh) is done with
  local dest=$REPO/docs/results/$2/runs/$1
  mkdir -p "$dest" && cp "$RUNS/$1/config.yaml" "$RUNS/$1/log.jsonl" "$RUNS/$1/summary.json" "$dest/"
  release "$@"
  rm -rf "$REPO/docs/results/cifar100/carry/$1"
}

while [[ ! -e STOP ]]; do
  picked=""
  while read -r commit config variant page extra; do
    [[ -z "$commit" || "$commit" == \#* ]] && continue
    archived "$variant" "$page" && continue
    if [[ -f $RUNS/$variant/summary.json ]]; then archive "$variant" "$page" "$commit"; continue; fi
    if mkdir "claims/$variant" 2>/dev/null; then picked="$commit|$config|$variant|$page|$extra"; break; fi
  done < queue.txt
  if [[ -z "$picked" ]]; then sleep 60; continue; fi
  IFS='|' read -r commit config variant page extra <<< "$picked"
  dir=$(checkout "$commit")
  out=$RUNS/$variant
  if [[ -f $out/last.safetensors ]]; then
    args=(--resume "$out")
  else
    rm -rf "$out.failed"; [[ -d $out ]] && mv "$out" "$out.failed"
    case $config in tinyimagenet.yaml) data=$DATA/tiny-imagenet-200;; *) data=$DATA/${config%.yaml};; esac
    # shellcheck disable=SC2206  # ARGS are words, as written in the queue
    args=(--config "$dir/configs/$config" --variant "${variant%%+*}" --data-dir "$data" --output "$out" $extra)
  fi
  echo "$(date -u +%FT%TZ) start $variant ($commit) ${args[*]}"
  (cd "$dir" && OMP_NUM_THREADS=1 PYTHONPATH=$dir/src $PY -m ssog train "${args[@]}") >> "$RUNS/$variant.out" 2>&1
  echo "$(date -u +%FT%TZ) end $variant rc=$?"
  [[ -f $out/summary.json ]] && archive "$variant" "$page" "$commit"
  rmdir "claims/$variant"
done
