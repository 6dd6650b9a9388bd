"""The summary of scripts/gpu_check.sh: its dry runs of the paper's CIFAR-100 recipes and its
1024 px inference point per family, beside the paper's own claims, as OUTPUT_DIR/summary.md.

    python scripts/gpu_report.py OUTPUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ssog.files import write_atomic

#: The paper's abstract at 1024 px, batch matched (Fig. 4, 5; A40, fp16): SSoG against dense attention.
PAPER_1024 = {
    "odevit": "up to +154% throughput, over 60% less peak memory",
    "vit": "over +30% throughput",
    "loopvit": "over +30% throughput",
}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds < 86_400 else f"{seconds / 86_400:.1f} days"


def dry_run_table(folder: Path) -> list[str]:
    lines = ["| recipe | params | GFLOPs/img | step (s) | images/s | loader images/s | peak GiB | epoch | schedule |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        r = json.loads(path.read_text())
        flops = "n/a" if r["gflops_per_image"] is None else f"{r['gflops_per_image']:.2f}"
        lines.append(f"| {path.stem} ({r['model']}, batch {r['batch_size']}, {r['amp']}) | {r['params']:,} | {flops} "
                     f"| {r['step_s']:.3f} | {r['model_images_per_s']:.1f} | {r['loader_images_per_s']:.1f} | "
                     f"{r['peak_memory_bytes'] / 2**30:.2f} | {_hours(r['epoch_s'])} | "
                     f"{_hours(r['schedule_s'])} ({r['epochs']} epochs) |")
    return lines


def inference_table(results: Path) -> list[str]:
    rows = json.loads(results.read_text())["rows"]
    lines = ["| family | px | batch | MHA images/s | SSoG images/s | throughput | MHA MiB | SSoG MiB | memory saved "
             "| the paper |", "|---|---|---|---|---|---|---|---|---|---|"]
    points = {(r["family"], r["resolution"], r["batch_size"], r["op"]): r for r in rows}
    for family, resolution, batch in sorted({key[:3] for key in points}):
        mha, ssog = points.get((family, resolution, batch, "mha")), points.get((family, resolution, batch, "ssog"))
        if mha is None or ssog is None:
            continue
        if mha["status"] == "ok" and ssog["status"] == "ok":
            gain = f"{100 * (ssog['images_per_s'] / mha['images_per_s'] - 1):+.0f}%"
            saved = f"{100 * (1 - ssog['peak_memory_mib'] / mha['peak_memory_mib']):.0f}%"
            values = (f"{mha['images_per_s']:.1f} | {ssog['images_per_s']:.1f} | {gain} | "
                      f"{mha['peak_memory_mib']:.0f} | {ssog['peak_memory_mib']:.0f} | {saved}")
        else:
            values = f"{mha['status']} | {ssog['status']} | | | |"
        lines.append(f"| {family} | {resolution} | {batch} | {values} | {PAPER_1024.get(family, '')} |")
    return lines


def main(output: Path) -> str:
    text = [f"# GPU check: {output}", "", "## Dry runs of the CIFAR-100 224 px recipes", ""]
    dry = output / "dry_run"
    text += dry_run_table(dry) if dry.is_dir() and any(dry.glob("*.json")) else ["(no dry run finished)"]
    text += ["", "## 1024 px inference (the paper: Fig. 4, 5 and its abstract, on an A40)", ""]
    results = output / "infer_1024" / "results.json"
    text += inference_table(results) if results.is_file() else ["(the 1024 px point did not finish)"]
    status = output / "status.txt"
    text += ["", "## Phases (exit status; 124: time limit)", "", "```", status.read_text().strip() if
             status.is_file() else "", "```", ""]
    write_atomic(output / "summary.md", "\n".join(text))
    return "\n".join(text)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/gpu_report.py OUTPUT_DIR")
    print(main(Path(sys.argv[1])))
