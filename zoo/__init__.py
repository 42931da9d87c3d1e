"""zoo: a distributed and quantization-aware training model zoo.

```python
import zoo

zoo.list_models()                                   # ['bert-base', 'bert-mini', ...]
card = zoo.get_card("bert-mini")                    # the model card: data, variants, metrics, speed
path = zoo.fetch("bert-mini", variant="int8-qat")   # a verified local file (sha256 checked)
```
"""

from __future__ import annotations

from pathlib import Path

from zoo.catalog import get_card, get_entry, list_models
from zoo.errors import ZooError

__all__ = ["fetch", "get_card", "get_entry", "list_models", "ZooError"]
__version__ = "0.1.0"


def fetch(name: str, variant: str = "fp32", dest: Path | None = None, **kwargs) -> Path:
    """Path to a verified copy of a model variant (see `zoo fetch`)."""
    from zoo.store.fetch import fetch as _fetch  # lazy: `import zoo` stays light (no torch, no onnxruntime)

    return _fetch(name, variant, dest=dest, **kwargs).path
