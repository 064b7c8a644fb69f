"""Small helpers the torch/tokenizers engines share: a tokenizer for counting, and the
bytes a torch module holds (docs/api.md §10 memory accounting, §4.6 token costs)."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["counting_tokenizer", "torch_bytes"]


def counting_tokenizer(tokenizer: Any) -> Any:
    """A private copy of a Hugging Face fast tokenizer's backend with truncation and
    padding off, for counting tokens and planning windows; ``None`` for a slow one.

    A copy, because the inference thread re-configures the shared tokenizer's
    truncation/padding on every call; counting must not race with it.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    backend = copy.deepcopy(backend)
    backend.no_truncation()
    backend.no_padding()
    return backend


def torch_bytes(model: Any) -> int:
    """Parameter plus buffer bytes of a torch module (0 when not loaded)."""
    if model is None:
        return 0
    tensors = [*model.parameters(), *model.buffers()]
    return int(sum(t.numel() * t.element_size() for t in tensors))
