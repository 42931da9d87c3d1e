"""A recipe's `group_by_length` side by side with whole padded rows, in one run (writes
benchmarks/results/length_grouping.{json,md}):

the same text recipe, steps and seed trained twice by the DDP launcher (2 processes, 1 thread each): once with every
batch padded to the data's full width, once with batches of similar texts cut to their longest. Reported: the median
step time of each and their ratio, the columns each computed on average, and the torch accuracy each reached on the
test split (what grouping might cost in learning: batches of one length are a less mixed sample).

    python benchmarks/length_grouping.py [--model bert-mini] [--steps 1000] [--render]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.data import load_dataset  # noqa: E402
from zoo.data.base import sequence_lengths  # noqa: E402
from zoo.fsutil import atomic_write_text, plural  # noqa: E402
from zoo.models import model_spec  # noqa: E402
from zoo.provenance import cpu_info, cpu_kind  # noqa: E402
from zoo.recipes import load_recipe  # noqa: E402
from zoo.run_summary import RunSummary  # noqa: E402
from zoo.train.schedule import BatchPlan  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROCESSES = 2


def train(out: Path, model: str, steps: int, grouped: bool) -> RunSummary:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--standalone", f"--nproc_per_node={PROCESSES}", str(ROOT / "launchers" / "ddp.py"),
           "--recipe", model, "--output-dir", str(out), "--no-tracking", f"steps={steps}", "quantization.scheme=none",
           "export.variants=[fp32]", "export.opsets=[17]", "checkpoint.interval_steps=0",
           f"group_by_length={str(grouped).lower()}"]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    return RunSummary.read(out)


def columns(model: str, steps: int) -> dict[str, float]:
    """The columns each process's batch has, on average over the steps: the full width padded, and what the trainer
    cuts the grouped batches to (the same plan it draws)."""
    recipe = load_recipe(model)
    data = load_dataset(recipe.dataset or model_spec(recipe.model).dataset)
    lengths = sequence_lengths(data.train.x, data.padding_id)
    plans = [BatchPlan(len(lengths), recipe.global_batch_size, rank, PROCESSES, recipe.seed, None, lengths=lengths)
             for rank in range(PROCESSES)]
    grouped = statistics.fmean(int(lengths[plan.rank_indices(step, 0)].max()) for step in range(steps) for plan in plans)
    return {"padded": float(data.train.x.shape[1]), "grouped": grouped}


def render(result: dict) -> str:
    step, width, accuracy = result["median_step_seconds"], result["mean_columns"], result["test_accuracy"]
    lines = [f"# Batches grouped by length (`group_by_length`), {result['model']} ({cpu_kind(result['cpu'])}, "
             f"{result['processes']} DDP processes, {plural(result['threads_per_process'], 'thread')} each)", "",
             f"The same recipe trained {result['steps']:,} steps twice in one run: a step of batches grouped by length "
             f"and cut to their longest text ran {result['padded_over_grouped_step_time']:.2f}x faster than a step of "
             f"rows padded to the data's full width; the test accuracy after the same steps differs by "
             f"{100 * (accuracy['grouped'] - accuracy['padded']):+.2f} points (grouped minus padded).", "",
             "| batches | columns a step (mean) | median step s | test accuracy after the same steps |",
             "| --- | ---: | ---: | ---: |"]
    for name in step:
        lines.append(f"| {name} | {width[name]:.1f} | {step[name]:.3f} | {accuracy[name]:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-mini", help="an entry's recipe on a text dataset")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--render", action="store_true", help="rewrite the .md report from the .json, measure nothing")
    args = parser.parse_args()
    if args.render:
        result = json.loads((RESULTS / "length_grouping.json").read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="zoo-bench-") as tmp:
            runs = {name: train(Path(tmp) / name, args.model, args.steps, name == "grouped")
                    for name in ("padded", "grouped")}
        step = {name: statistics.median(s.phases["fp32"].step_seconds) for name, s in runs.items()}
        result = {
            "model": args.model, "steps": args.steps, "processes": PROCESSES, "threads_per_process": 1,
            "cpu": cpu_info(), "median_step_seconds": step,
            "padded_over_grouped_step_time": step["padded"] / step["grouped"],
            "mean_columns": columns(args.model, args.steps),
            "test_accuracy": {name: s.torch_accuracy["fp32"] for name, s in runs.items()},
            "final_loss": {name: s.phases["fp32"].final_loss for name, s in runs.items()},
        }
        atomic_write_text(RESULTS / "length_grouping.json", json.dumps(result, indent=2) + "\n")
    report = render(result)
    atomic_write_text(RESULTS / "length_grouping.md", report)
    print(report)


if __name__ == "__main__":
    main()
