"""What the ``sam3_concept`` model reads from a request: its phrases, their tokens, its scalars.

Shipped beside ``concept_model.py`` (see :mod:`triton_sam.serving`); ``pb_utils`` is passed
in. Refusals are :class:`~.bounds.RequestError` naming the field (``text[2]: empty, ...``).
"""

from __future__ import annotations

import numpy as np

from . import model_io
from .bounds import RequestError
from .protocol import concept as protocol


class Tokenizer:
    """Sam3Processor's tokenisation: CLIP tokens, padded to the context length, never cut."""

    def __init__(self, path, pad_id, context_length):
        from tokenizers import Tokenizer as RustTokenizer

        self._tokenizer = RustTokenizer.from_file(path)
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.pad_id = int(pad_id)
        self.context_length = int(context_length)

    def encode(self, phrases):
        """phrases (list of str) -> (input_ids, attention_mask), int64 [N, context_length]."""
        ids = np.full((len(phrases), self.context_length), self.pad_id, np.int64)
        mask = np.zeros((len(phrases), self.context_length), np.int64)
        for i, encoding in enumerate(self._tokenizer.encode_batch(list(phrases))):
            n = len(encoding.ids)
            if n > self.context_length:
                raise RequestError(
                    protocol.TEXT,
                    f"phrase {i} ({phrases[i][:40]!r}) is {n} tokens, expected "
                    f"at most {self.context_length} including its start and end tokens "
                    "(Sam3Processor does not truncate and the text encoder has "
                    f"{self.context_length} positions); shorten it",
                )
            ids[i, :n] = encoding.ids
            mask[i, :n] = 1
        return ids, mask


def phrases(pb_utils, request, max_phrases: int) -> list[str]:
    """The request's phrases ([] when it sends none: embed or probe only)."""
    tensor = model_io.tensor(pb_utils, request, protocol.TEXT)
    if tensor is None:
        return []
    values = model_io.single(tensor.as_numpy(), protocol.TEXT).reshape(-1)
    if not 1 <= values.size <= max_phrases:
        raise RequestError(
            protocol.TEXT, f"got {values.size} phrases, expected 1 to {max_phrases} per request"
        )
    found = []
    for i, value in enumerate(values):
        field = f"{protocol.TEXT}[{i}]"
        if len(value) > protocol.MAX_PHRASE_BYTES:
            raise RequestError(
                field, f"{len(value)} bytes, expected at most {protocol.MAX_PHRASE_BYTES}"
            )
        phrase = model_io.utf8(value, field)
        if not phrase.strip():
            raise RequestError(field, "empty, expected a noun phrase such as 'red car'")
        found.append(phrase)
    return found


def scalar(pb_utils, request, name: str, default, low, high):
    """Optional number ``name`` in [low, high], or ``default`` when the request leaves it out."""
    value = model_io.one_value(pb_utils, request, name)
    if value is None:
        return default
    if not np.isfinite(value) or not low <= value <= high:
        raise RequestError(name, f"got {value}, expected a number in [{low}, {high}]")
    return value.item()
