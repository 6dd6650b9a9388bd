#!/usr/bin/env bash
# Paired margins of the released weights (weights/), each pair on the 5,000 validation images its
# runs held out: `ssog eval --compare`, written to paired/NAME.json (docs/results/cifar100.md,
# "Margins on the same images"). A pair whose file exists is skipped, so a new line runs alone.
# Run from the repository's root: bash docs/results/cifar100/paired.sh DATA_DIR (the folder with train/)
set -eu
data=${1:?give the CIFAR-100 ImageFolder folder, the one with train/}
here=docs/results/cifar100
pair() {  # NAME A B: A - B
  [[ -f $here/paired/$1.json ]] && return
  ssog eval --checkpoint "$here/weights/$2" --compare "$here/weights/$3" --dataset imagefolder \
    --data-dir "$data" --val-split 5000 --split-seed 0 --output "$here/paired/$1.json" | tail -1
}
pair odevit_p2_ssog_vs_mha odevit_ssog_p2 odevit_mha_p2
pair odevit_p2_ssog_seed1_vs_mha odevit_ssog_p2_seed1 odevit_mha_p2
pair odevit_p2_time_kernels_vs_mha odevit_ssog_p2_time_kernels odevit_mha_p2
pair odevit_p2_ssog_seed1_vs_seed0 odevit_ssog_p2_seed1 odevit_ssog_p2
pair odevit_p2_mha_lr4e-3_vs_lr8e-3 odevit_mha_p2 odevit_mha_p2_lr8e-3
pair odevit_p2_ssog_seed1_vs_mha_seed1 odevit_ssog_p2_seed1 odevit_mha_p2_seed1
pair odevit_p2_mha_seed1_vs_seed0 odevit_mha_p2_seed1 odevit_mha_p2
pair odevit_p2_time_kernels_seed1_vs_mha_seed1 odevit_ssog_p2_time_kernels_seed1 odevit_mha_p2_seed1
pair odevit_p2_time_kernels_vs_fixed odevit_ssog_p2_time_kernels odevit_ssog_p2
pair odevit_p2_time_kernels_seed1_vs_fixed_seed1 odevit_ssog_p2_time_kernels_seed1 odevit_ssog_p2_seed1
pair vit_ssog_vs_mha vit_ssog vit_mha
pair loopvit_ssog_vs_mha loopvit_ssog loopvit_mha
pair odevit_ssog_vs_mha odevit_ssog odevit_mha
pair vit_p2_ssog_vs_mha vit_ssog_p2 vit_mha_p2
pair loopvit_p2_ssog_vs_mha loopvit_ssog_p2 loopvit_mha_p2
