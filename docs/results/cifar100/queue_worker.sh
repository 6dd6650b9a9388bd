#!/usr/bin/env bash
# A queue worker: takes the first line of queue.txt ("CHECKOUT CONFIG VARIANT[+TAG] ARCHIVE [ARGS...]")
# whose run is neither finished nor claimed by another worker, trains it from that checkout (a
# run folder that exists is resumed), copies its config, log and summary into
# docs/results/ARCHIVE/runs/, and takes the next. Idles while the queue has nothing; stops
# when the file STOP exists.
set -u
cd /work/runs43
PY=/work/main/.venv/bin/python
mkdir -p claims
while [[ ! -e STOP ]]; do
  picked=""
  while read -r checkout config variant archive extra; do
    [[ -z "$checkout" || "$checkout" == \#* ]] && continue
    [[ -f /work/runs43/$variant/summary.json ]] && continue
    if mkdir claims/$variant 2>/dev/null; then picked="$checkout|$config|$variant|$archive|$extra"; break; fi
  done < queue.txt
  if [[ -z "$picked" ]]; then sleep 60; continue; fi
  IFS='|' read -r checkout config variant archive extra <<< "$picked"
  out=/work/runs43/$variant
  if [[ -f $out/last.safetensors ]]; then
    args=(--resume "$out")
  else
    rm -rf "$out.failed"; [[ -d $out ]] && mv "$out" "$out.failed"
    args=(--config "$checkout/configs/$config" --variant "${variant%%+*}" --data-dir "$(case $config in tinyimagenet.yaml) echo /tmp/data/tiny-imagenet-200;; *) echo /tmp/data/${config%.yaml};; esac)" --output "$out" $extra)
  fi
  echo "$(date -u +%FT%TZ) start $variant ${args[*]}"
  (cd "$checkout" && OMP_NUM_THREADS=1 PYTHONPATH=$checkout/src $PY -m ssog train "${args[@]}") >> /work/runs43/$variant.out 2>&1
  echo "$(date -u +%FT%TZ) end $variant rc=$?"
  if [[ -f $out/summary.json ]]; then
    dest=/work/main/docs/results/$archive/runs/$variant
    mkdir -p "$dest" && cp "$out/config.yaml" "$out/log.jsonl" "$out/summary.json" "$dest/"
  fi
  rmdir claims/$variant
done
