"""`zoo predict`: classify texts with an entry's ONNX file, as a user would after `zoo fetch`.

Everything the file needs travels with it: the tokenizer that makes its input ids is in its metadata
(`zoo.tokenizer`, the `tokenizers` library's JSON), the class names are on the card. No PyTorch is imported: the
file is fetched (verified by sha256) and run by onnxruntime.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from zoo import catalog
from zoo.errors import ZooError
from zoo.evaluate import predict
from zoo.metadata import TOKENIZER_KEY, read_metadata
from zoo.store.fetch import fetch



def classify(name: str, texts: list[str], variant: str = "fp32", top: int = 3) -> list[dict]:
    """One answer per text: the label, its probability, and the `top` most probable labels."""
    card = catalog.get_card(name)
    card.inference_variants([variant])  # refuses a variant that is not one built ONNX inference model, naming those
    if not texts:
        raise ZooError("give at least one text to classify")
    path = fetch(name, variant, show_progress=False).path
    meta = read_metadata(path)
    if TOKENIZER_KEY not in meta:
        shape = " x ".join(str(d) for d in card.inputs[0].shape) if card.inputs else "its"
        raise ZooError(f"'{name}' takes {card.inputs[0].dtype if card.inputs else 'tensor'} inputs of shape [{shape}], "
                       "not text: load its file with onnxruntime (`zoo fetch` gives the path)")
    tokenizer = Tokenizer.from_str(meta[TOKENIZER_KEY])
    ids = np.array([encoding.ids for encoding in tokenizer.encode_batch(texts)], dtype=np.int64)
    logits = predict(path, ids)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    labels = card.outputs[0].labels or [str(i) for i in range(logits.shape[1])]
    answers = []
    for text, row in zip(texts, probabilities):
        order = np.argsort(-row)[:max(1, top)]
        answers.append({"text": text, "label": labels[order[0]], "probability": float(row[order[0]]),
                        "top": [{"label": labels[i], "probability": float(row[i])} for i in order]})
    return answers
