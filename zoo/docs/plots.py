"""The plots on a model page: training curve per phase, accuracy (95% interval) against latency."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from zoo.cards import ModelCard
from zoo.docs.common import load_json
from zoo.fsutil import plural
from zoo.metrics import wilson_interval
from zoo.kinds import kind_of

matplotlib.use("Agg")  # files only, never a window


def plots(card: ModelCard, folder: Path, out: Path) -> list[str]:
    images = []
    curve = load_json(folder / "training_curve.json")
    phases = {phase: points for phase, points in (curve or {}).items() if points["step"]}
    if phases:
        # One panel per phase, each over its own steps: a QAT phase of a few hundred steps after thousands of fp32
        # steps would otherwise be a sliver at the right edge.
        fig, axes = plt.subplots(1, len(phases), figsize=(6.4, 3.2), sharey=True, squeeze=False,
                                 gridspec_kw={"width_ratios": [2] + [1] * (len(phases) - 1)})
        for ax, (phase, points) in zip(axes[0], phases.items()):
            ax.plot(points["step"], points["loss"])
            ax.set(xlabel=f"{phase} optimizer step", yscale="log", title=phase)
        axes[0][0].set_ylabel("training loss")
        fig.suptitle(f"{card.name}: training curve")
        fig.tight_layout()
        fig.savefig(out / f"{card.name}-curve.png", dpi=110)
        plt.close(fig)
        images.append(f"![training curve](img/{card.name}-curve.png)")
        if "qat" in phases:
            images += ["", "The qat panel continues from the trained fp32 weights with fake quantization inserted "
                           "(weights and activations rounded to int8 in every step, at the recipe's "
                           "`quantization.qat_lr`), so its losses sit above the end of fp32's: what the rounding costs "
                           "after fine-tuning is int8-qat's accuracy in the variants table.", ""]
    # Variants measured on the card's test set only (a retrained variant's accuracy is on its own recipe's data).
    timed = {k: v for k, v in card.variants.items() if v.speed and v.metrics.get(card.primary_metric) is not None
             and kind_of(k, v).reference != "retrained"}
    tested = card.dataset.splits.get("test")
    if timed:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        for (key, v), marker in zip(timed.items(), "osD^vP*X"):  # a marker each: equal points stay distinguishable
            metric = v.metrics[card.primary_metric]
            low, high = wilson_interval(metric, tested) if tested else (metric, metric)
            ax.errorbar(v.speed.batch_32.median_ms, metric, yerr=[[metric - low], [high - metric]], fmt=marker,
                        capsize=3, label=key, markerfacecolor="none", markersize=8)  # the interval as it is: never above 1
        ax.set(xlabel=f"onnxruntime latency, batch 32, {plural(next(iter(timed.values())).speed.threads, 'thread')} (ms)",
               ylabel=card.primary_metric,
               title=f"{card.name}: accuracy (95% CI) vs latency")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{card.name}-tradeoff.png", dpi=110)
        plt.close(fig)
        images.append(f"![accuracy vs latency](img/{card.name}-tradeoff.png)")
    return images
