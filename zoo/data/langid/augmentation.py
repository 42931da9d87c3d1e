"""Training copies of a language-ID text: what users type that prose lacks (short snippets, numbers, addresses,
code-ish tokens, dropped punctuation, random case), drawn deterministically from the text itself."""

from __future__ import annotations

import random
import re

from zoo.data.langid.sources import digest

# What users type that prose lacks: numbers, addresses, code-ish tokens (mixed into training copies).
_INSERTS = ["2024", "12:30", "3,5", "42", "1999", "100%", "+49 30 1234567", "v2.1", "https://example.org/a?b=1",
            "user@example.com", "#1", "x86_64", "C++", "Wi-Fi", "OK", "CPU", "PDF", "USB", "iPhone", ":)", "..."]
_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


def augment(text: str) -> list[str]:
    """Training copies of one text, drawn from a generator seeded by the text (so the dataset is deterministic):
    the text itself, a short snippet of 1-6 words, and a copy with punctuation dropped or a number / address /
    code token mixed in, in random case."""
    rng = random.Random(digest(text))
    words = text.split()
    n = rng.randint(1, min(6, len(words)))
    start = rng.randrange(len(words) - n + 1)
    snippet = " ".join(words[start:start + n])
    noisy = _PUNCT.sub(" ", text) if rng.random() < 0.5 else text
    noisy_words = noisy.split() or words
    noisy_words.insert(rng.randrange(len(noisy_words) + 1), rng.choice(_INSERTS))
    noisy = " ".join(noisy_words)
    noisy = rng.choice([noisy, noisy.upper(), noisy.lower(), noisy.title()])
    return [text, snippet, noisy]
