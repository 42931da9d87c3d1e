"""zoo: a distributed and quantization-aware training model zoo.

```python
import zoo

zoo.list_models()                                   # ['bert-base', 'bert-mini', ...]
card = zoo.get_card("bert-mini")                    # the model card: data, variants, metrics, speed
path = zoo.fetch("bert-mini", variant="int8-qat")   # a verified local file (sha256 checked)
```
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

# DeepSpeed's accelerator probe prints a warning to *stdout* (breaking `--json` output) when it finds no GPU. Without
# NVIDIA devices the answer is known: say it up front.
if "DS_ACCELERATOR" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["DS_ACCELERATOR"] = "cpu"


class _OnnxruntimeWithoutOrtmodule(importlib.abc.MetaPathFinder):
    """onnxruntime-training 1.19's `import onnxruntime` checks its build by importing ORTModule, which imports torch,
    DeepSpeed and MLflow: 9 s of CPU (0.4 s without) in every process that runs a model, each CLI command and each
    Flower ClientApp of every round. The zoo never uses ORTModule: whenever onnxruntime is first imported, this
    runs its `__init__` with ORTModule unavailable (the check then skips the CUDA build report it feeds), and then
    steps aside, so ORTModule imports as usual afterwards."""

    BLOCKED = "onnxruntime.training.ortmodule"

    def find_spec(self, fullname, path, target=None):
        if fullname != "onnxruntime":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            sys.modules.setdefault(self.BLOCKED, None)  # an import of it fails at once, without its parents
            try:
                run(module)
            finally:
                if sys.modules.get(self.BLOCKED, False) is None:
                    del sys.modules[self.BLOCKED]
                if self in sys.meta_path:
                    sys.meta_path.remove(self)

        spec.loader.exec_module = exec_module
        return spec


if "onnxruntime" not in sys.modules:
    sys.meta_path.insert(0, _OnnxruntimeWithoutOrtmodule())

from zoo.catalog import get_card, get_entry, list_models  # noqa: E402  (after the import hook above)
from zoo.errors import ZooError  # noqa: E402

__all__ = ["fetch", "get_card", "get_entry", "list_models", "ZooError"]
__version__ = "0.1.0"


def fetch(name: str, variant: str = "fp32", dest: Path | None = None, **kwargs) -> Path:
    """Path to a verified copy of a model variant (see `zoo fetch`)."""
    from zoo.store.fetch import fetch as _fetch  # lazy: `import zoo` stays light (no torch, no onnxruntime)

    return _fetch(name, variant, dest=dest, **kwargs).path
