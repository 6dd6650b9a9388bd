#!/usr/bin/env bash
# GPU readiness check: the project's GPU measurements, in one run.
#
#   scripts/gpu_check.sh [--dry-run] [--goals] [OUTPUT_DIR]      (default OUTPUT_DIR: runs/gpu_check)
#
# On a CUDA machine, in order, each phase under its own time limit:
#   0. goals-*:       the fused path's goals (scripts/gpu_goals.py; at most 4 min 50 s): the operator
#                     against SDPA at 14x14, 32x32, 64x64 (fp16, eager and CUDA-graph-replayed, kernels
#                     per call, forward+backward peak memory; a layer under compile's reduce-overhead),
#                     then the three families at D=768, batch
#                     32, fp16, 224/512/1024 px, inference and training steps; goals.md sets each
#                     figure against its goal. --goals runs these phases alone.
# and then (at most 9 min 25 s):
#   1. operator:      ssog bench-op, fp16, every backend (auto, dense, separable, local, triton)
#                     against SDPA (flash attention on CUDA fp16), grids 14-64, forward and
#                     forward+backward; then the steered layer (mu+sigma) against MHA at 32x32, 48x48;
#                     then auto's mixing under torch.compile (inductor: Triton) at 14x14 and 32x32
#   2. sweep-infer:   the reduced paper sweep, D=768 (base), batch 8 and 64, 224-1024 px, inference
#   3. sweep-train:   the same sweep, training steps (forward + backward + AdamW)
#   4. nccl-smoke:    torchrun --nproc_per_node 1 -m ssog train for one short epoch (nccl process group)
#   5. dry-run-*:     ssog train --dry-run of the CIFAR-100 224 px recipes at D=768 (bf16, batch 256,
#                     discrete, looped, continuous): step time, images/s, loader, peak memory, and
#                     the projected epoch and 500-epoch schedule
#   6. infer-1024:    one 1024 px inference point per family and op (D=768, batch 8, fp16)
# Results (CSV/JSON/Markdown/plots and one log per phase) go under OUTPUT_DIR; status.txt lists
# each phase with its exit status (124: its time limit); summary.md (scripts/gpu_report.py) sets
# the dry runs and the 1024 px point beside the paper's claims. A failed phase does not stop the
# others; the script exits non-zero if any failed.
#
# --dry-run runs the same phases on the CPU at tiny sizes (seconds; tested in CI).
# PYTHON (default: python) and TORCHRUN (default: torchrun) select the interpreters.
set -uo pipefail

dry_run=0
goals_only=0
output=runs/gpu_check
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        --goals) goals_only=1 ;;
        -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu_check.sh: unknown option $arg (expected --dry-run, --goals or an output folder)" >&2; exit 2 ;;
        *) output=$arg ;;
    esac
done
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python}
torchrun=${TORCHRUN:-torchrun}
mkdir -p "$output"
: > "$output/status.txt"

if [ "$dry_run" = 1 ]; then
    operator=(--grids 4 6 --batch 1 --heads 2 --head-dim 16 --rounds 1 --warmup 0 --steered-grid 0 --device cpu)
    steered=(--steered-layer 4 --rounds 1 --warmup 0 --device cpu)
    compiled=(--grids 4 --batch 1 --heads 2 --head-dim 16 --rounds 1 --warmup 0 --steered-grid 0 --device cpu
              --backends separable --compile auto)
    sweep=(--size micro --families vit --resolutions 4 8 --batch-sizes 1 --width-sizes --warmup 1 --iters 1 --device cpu)
    smoke=(--dataset synthetic --set synthetic_size=8 --set synthetic_classes=2 --img-size 8 --epochs 1
           --batch-size 4 --device cpu --threads 1 --no-progress)
    recipes=(--config "$repo/configs/cifar10_tiny.yaml" --dataset synthetic --set synthetic_size=16 --batch-size 8
             --device cpu --threads 1)
    dry_run_steps=1
    variants=(ssog ssog_loopvit ssog_odevit)
    infer_1024=(--size micro --resolutions 16 --batch-sizes 1 --width-sizes --warmup 1 --iters 1 --device cpu)
    limits=(120 120 120 120 120 120 120 120 120 120)
    goals_operator=(--device cpu --grids 4 --rounds 1 --warmup 0 --compile-backend eager --compile-mode none)
    goals_models=(--size micro --resolutions 8 16 --batch-sizes 1 --width-sizes --warmup 1 --iters 1 --device cpu)
    goal_limits=(120 120 120)
else
    if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check.sh: no CUDA device here; use --dry-run for the CPU rehearsal" >&2
        exit 2
    fi
    operator=(--grids 14 16 24 32 48 64 --dtype float16 --device cuda --rounds 20 --warmup 3
              --backends auto dense separable local triton --dense-max-grid 64)
    steered=(--steered-layer 32 48 --device cuda --rounds 20 --warmup 3)
    compiled=(--grids 14 32 --dtype float16 --device cuda --rounds 20 --warmup 3 --steered-grid 0
              --backends separable --compile auto)
    sweep=(--preset paper --batch-sizes 8 64 --width-sizes --warmup 2 --iters 5 --device cuda --dtype fp16)
    smoke=(--model ssog_vit_small_patch16_224 --dataset synthetic --set synthetic_size=512 --img-size 224
           --epochs 1 --batch-size 64 --device cuda --no-progress)
    recipes=(--device cuda)
    dry_run_steps=5
    variants=(width_vit_ssog width_loopvit_ssog width_odevit_ssog)
    infer_1024=(--size base --resolutions 1024 --batch-sizes 8 --width-sizes --warmup 3 --iters 10 --device cuda
                --dtype fp16)
    limits=(60 35 50 100 100 45 45 45 45 40)
    goals_operator=(--device cuda --rounds 20 --warmup 3)
    goals_models=(--size base --resolutions 224 512 1024 --batch-sizes 32 --width-sizes --warmup 2 --iters 5
                  --device cuda --dtype fp16)
    goal_limits=(90 80 120)
fi

failed=0
phase() {  # phase NAME LIMIT_S COMMAND...
    local name=$1 limit=$2 status
    shift 2
    echo "== $name (at most ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" > "$output/$name.log" 2>&1
    status=$?
    echo "$name $status" >> "$output/status.txt"
    if [ "$status" != 0 ]; then
        failed=1
        echo "   failed with status $status; last lines of $output/$name.log:"
        tail -n 5 "$output/$name.log" | sed 's/^/   /'
    fi
}

phase goals-operator "${goal_limits[0]}" "$python" "$repo/scripts/gpu_goals.py" operator "$output" "${goals_operator[@]}"
phase goals-inference "${goal_limits[1]}" "$python" -m ssog bench "${goals_models[@]}" --mode inference \
    --no-plots --output "$output/goals_inference"
phase goals-train "${goal_limits[2]}" "$python" -m ssog bench "${goals_models[@]}" --mode train --no-plots \
    --output "$output/goals_train"
"$python" "$repo/scripts/gpu_goals.py" report "$output" || echo "   the goals' report (scripts/gpu_goals.py) failed"
if [ "$goals_only" = 1 ]; then
    cat "$output/status.txt"
    exit "$failed"
fi

phase operator "${limits[0]}" "$python" -m ssog bench-op "${operator[@]}" --output "$output/operator"
phase steered-layer "${limits[1]}" "$python" -m ssog bench-op "${steered[@]}" --output "$output/operator"
phase operator-compile "${limits[2]}" "$python" -m ssog bench-op "${compiled[@]}" --output "$output/operator_compile"
phase sweep-inference "${limits[3]}" "$python" -m ssog bench "${sweep[@]}" --mode inference --output "$output/sweep_inference"
phase sweep-train "${limits[4]}" "$python" -m ssog bench "${sweep[@]}" --mode train --output "$output/sweep_train"
phase nccl-smoke "${limits[5]}" "$torchrun" --standalone --nproc_per_node 1 -m ssog train "${smoke[@]}" --output "$output/train_smoke"
mkdir -p "$output/dry_run"
for i in 0 1 2; do
    variant=${variants[$i]}
    if [ "$dry_run" = 1 ]; then
        recipe=(--variant "$variant")
    else
        recipe=(--config "$repo/configs/width/$variant.yaml" --variant base)
    fi
    phase "dry-run-$variant" "${limits[$((6 + i))]}" "$python" -m ssog train --dry-run "$dry_run_steps" "${recipes[@]}" \
        "${recipe[@]}" --dry-run-report "$output/dry_run/$variant.json"
done
phase infer-1024 "${limits[9]}" "$python" -m ssog bench "${infer_1024[@]}" --mode inference --output "$output/infer_1024"
"$python" "$repo/scripts/gpu_report.py" "$output" > /dev/null || echo "   the summary (scripts/gpu_report.py) failed"

echo "status per phase (0 = ok, 124 = time limit): $output/status.txt; summary: $output/summary.md"
cat "$output/status.txt"
exit "$failed"
