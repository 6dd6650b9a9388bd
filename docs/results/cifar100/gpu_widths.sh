#!/usr/bin/env bash
# CIFAR-100 runs on one CUDA device, all at once (MPS where it starts): by default what the width
# axis still needs, MHA's width-192 row at the width-192 check's best rate (1e-3), that check's
# lower point and SSoG's width-192 check. Each run is `ssog train --config
# configs/cifar100.yaml --variant V` unchanged, with --device cuda. From the repository's root:
#   bash docs/results/cifar100/gpu_widths.sh TARBALL OUTPUT_DIR DEADLINE_S [VARIANT ...]
# TARBALL: cifar100-train.tar.gz; OUTPUT_DIR gets widths.tgz (each run's config, log, summary
# and console output), remade every 15 s, so a run cut off at DEADLINE_S (seconds from the
# start; the runs still going are then stopped) leaves what it had done. EXTRA (words) is added
# to every command, e.g. EXTRA="--device cpu --max-steps 2" for a rehearsal without a GPU.
# QUEUE=FILE (no VARIANTs): the queue's CIFAR-100 lines (queue.txt's "COMMIT cifar100.yaml
# VARIANT[+TAG] PAGE [ARGS...]") whose run is not archived under RESULTS/PAGE/runs/ (RESULTS:
# docs/results unless set), each with its ARGS, from this tree (not the line's commit: say so
# where the runs are archived).
# Archive each finished run under docs/results/cifar100/runs/VARIANT (VARIANT+gpu where the same
# variant also ran on a CPU).
set -u
tarball=$1; out=$2; deadline=$3; shift 3
runs=()  # "NAME|ARGS": NAME is VARIANT[+TAG], its run folder
if [[ -n ${QUEUE:-} ]]; then
    while read -r commit config variant page extra; do
        [[ -z $commit || $commit == \#* || $config != cifar100.yaml ]] && continue
        [[ -f ${RESULTS:-docs/results}/$page/runs/$variant/summary.json ]] || runs+=("$variant|$extra")
    done < "$QUEUE"
else
    (( $# )) || set -- vit_mha_w192_lr1e-3 sweep_vit_mha_w192_lr5e-4 sweep_vit_ssog_w192_lr8e-3 \
        sweep_vit_ssog_w192_lr1.6e-2
    for variant in "$@"; do runs+=("$variant|"); done
fi
(( ${#runs[@]} )) || { echo "nothing to run"; exit 0; }
python=${PYTHON:-python3}
start=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/data" "$work/runs"
tar xzf "$tarball" -C "$work/data"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$work/runs/gpu.txt" 2>&1

# MPS lets the small runs' kernels share the GPU at once instead of taking turns; where it does
# not start, the runs share the GPU by time slices.
export CUDA_MPS_PIPE_DIRECTORY=$work/mps CUDA_MPS_LOG_DIRECTORY=$work/mps
mkdir -p "$work/mps"
if nvidia-cuda-mps-control -d 2>/dev/null \
        && timeout 40 "$python" -c "import torch; torch.ones(1, device='cuda').sum().item()" 2>/dev/null; then
    echo "mps: on" >> "$work/runs/gpu.txt"
else
    echo quit | nvidia-cuda-mps-control 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    echo "mps: off" >> "$work/runs/gpu.txt"
fi

pids=()
for run in "${runs[@]}"; do
    name=${run%%|*}; args=${run#*|}
    # shellcheck disable=SC2086  # ARGS and EXTRA are words
    OMP_NUM_THREADS=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 "$python" -m ssog train \
        --config configs/cifar100.yaml --variant "${name%%+*}" --data-dir "$work/data/cifar100" \
        --output "$work/runs/$name" --device cuda --threads 1 --no-progress $args ${EXTRA:-} \
        > "$work/runs/$name.out" 2>&1 &
    pids+=($!)
done

pack() {  # the runs' records so far, replaced atomically
    (cd "$work/runs" && tar czf "$out/widths.tgz.part" --ignore-failed-read gpu.txt ./*.out \
        ./*/config.yaml ./*/log.jsonl ./*/summary.json 2>/dev/null)
    mv "$out/widths.tgz.part" "$out/widths.tgz"
}
while (( $(date +%s) - start < deadline )); do
    running=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    (( running )) || break
    pack
    sleep 15
done
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
wait
echo quit | nvidia-cuda-mps-control 2>/dev/null
pack
echo "$(( $(date +%s) - start )) s; finished: $(cd "$work/runs" && ls -d ./*/summary.json 2>/dev/null | wc -l) of ${#runs[@]}"
