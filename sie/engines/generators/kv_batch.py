"""The transformers generator's per-request state and its padded decode batch: the
sequences decoding together share one left-padded KV cache per layer, with a 2-D
attention mask hiding the padding (``sie.engines.generators.transformers_gen``). torch and the
cache class are passed in: nothing here imports them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sie.engines.generation import SamplingParams, StopMatcher
from sie.engines.generators.json_mode import JsonPrefix

__all__ = ["DecodeBatch", "SeqState"]


@dataclass(eq=False)
class SeqState:
    """One request inside the engine (mutated by the engine thread only, except
    ``aborted``)."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new: int
    deliver: Callable[[object], bool]
    generator: Any
    stop: StopMatcher
    out_count: int = 0  # completion tokens sampled (EOS included)
    text_ids: list[int] = field(default_factory=list)  # sampled ids that carry text
    prefix_offset: int = 0
    read_offset: int = 0
    unsent_tokens: int = 0
    prefilled: int = 0
    cache: Any = None  # its own KV cache while prefilling
    pending: int | None = None  # sampled, not yet fed to the model
    aborted: bool = False
    done: bool = False  # finished; its row leaves the batch at the end of this step
    removed: threading.Event = field(default_factory=threading.Event)
    json: JsonPrefix | None = None  # response_format json_object: the object so far
    entry: dict[str, Any] | None = None  # the last sampled token's logprob entry
    unsent_logprobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kv_tokens(self) -> int:
        """Tokens whose keys/values this sequence holds."""
        return self.prefilled + max(0, self.out_count - 1)

    @property
    def reserved(self) -> int:
        """Tokens it will hold by its first completion token (admission counts these)."""
        return max(len(self.prompt_ids) + 1, self.kv_tokens)


class DecodeBatch:
    """Decoding sequences sharing one left-padded KV cache."""

    def __init__(self, seq: SeqState, torch: Any) -> None:
        self.torch = torch
        self.seqs = [seq]
        self.cache = seq.cache
        seq.cache = None
        self.mask = torch.ones((1, seq.prefilled), dtype=torch.long)

    def merge(self, seq: SeqState, cache_cls: Any) -> None:
        """Add a sequence that finished prefill (its own cache, no padding)."""
        torch = self.torch
        lb, ln = self.mask.shape[1], seq.prefilled
        length = max(lb, ln)

        def pad(x: Any, n: int) -> Any:
            if n == 0:
                return x
            shape = list(x.shape)
            shape[-2 if x.dim() == 4 else -1] = n
            return torch.cat([x.new_zeros(shape), x], dim=-2 if x.dim() == 4 else -1)

        data = [
            (
                torch.cat([pad(a.keys, length - lb), pad(b.keys, length - ln)], dim=0),
                torch.cat([pad(a.values, length - lb), pad(b.values, length - ln)], dim=0),
            )
            for a, b in zip(self.cache.layers, seq.cache.layers, strict=True)
        ]
        self.cache = cache_cls(ddp_cache_data=data)
        new_mask = torch.ones((1, ln), dtype=torch.long)
        self.mask = torch.cat([pad(self.mask, length - lb), pad(new_mask, length - ln)], dim=0)
        self.seqs.append(seq)
        seq.cache = None

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (non-empty), trimming padding columns no row needs."""
        torch = self.torch
        if len(rows) != len(self.seqs):
            idx = torch.tensor(rows, dtype=torch.long)
            for layer in self.cache.layers:
                layer.keys = layer.keys.index_select(0, idx)
                layer.values = layer.values.index_select(0, idx)
            self.mask = self.mask.index_select(0, idx)
            self.seqs = [self.seqs[i] for i in rows]
        start = int(self.mask.any(dim=0).nonzero()[0])
        if start > 0:
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, start:, :]
                layer.values = layer.values[:, :, start:, :]
            self.mask = self.mask[:, start:]
