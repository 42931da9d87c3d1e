"""The zoo's one import of onnxruntime: `from zoo.ort import ort` (modules that use a submodule import this first).

onnxruntime-training 1.19's `import onnxruntime` checks its build by importing ORTModule, which imports torch,
DeepSpeed and MLflow: 9 s of CPU (0.4 s without) in every process that runs a model, each CLI command and each Flower
ClientApp of every round, and DeepSpeed's accelerator probe prints a warning to stdout (breaking `--json` output).
The zoo never uses ORTModule, so onnxruntime is imported here with ORTModule unavailable for the length of that one
import (its `__init__` then skips the CUDA build report the check feeds); nothing else in the process changes, and
ORTModule imports as usual afterwards. tests/test_layout.py keeps every other import of onnxruntime behind this one.
"""

from __future__ import annotations

import importlib.util
import sys

from zoo.imports import unavailable

ORTMODULE = "onnxruntime.training.ortmodule"

with unavailable(ORTMODULE):
    import onnxruntime as ort

__all__ = ["ort", "training_package_without_torch"]


def training_package_without_torch() -> None:
    """onnxruntime-training 1.19.2's package `__init__` imports torch and DeepSpeed (for ORTModule, `amp`, `optim`,
    which the zoo never uses); its `api`, `artifacts` and `onnxblock` submodules need neither. The package is
    registered without running that `__init__` (zoo.ondevice.engine calls this before importing them), so a device
    or a federated client trains with onnxruntime alone."""
    if "onnxruntime.training" not in sys.modules:
        spec = importlib.util.find_spec("onnxruntime.training")
        sys.modules["onnxruntime.training"] = importlib.util.module_from_spec(spec)
