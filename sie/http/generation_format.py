"""Response shapes of the generation routes (``sie.http.generation``; docs/api.md §5,
§5.1): whole responses and stream chunks of ``/v1/chat/completions`` (``chat``),
``/v1/completions`` (``completions``) and ``/v1/generate/{model}`` (``native``).

Log probabilities arrive from the worker in OpenAI's chat shape, one entry per token
(``{"token", "logprob", "bytes", "top_logprobs"}``); chat answers them as
``{"content": [...], "refusal": null}`` and completions in the legacy shape
``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``
(each token's character offset in the completion; the sampled token is always in its
``top_logprobs`` map, as vLLM answers). A request that asked for none gets
``"logprobs": null``.

Streams: with ``stream_options.include_usage`` every chunk carries ``"usage": null``
and a last chunk the totals (OpenAI's documented behaviour); with
``include_obfuscation`` every chunk of chat and completions carries an
``"obfuscation"`` field of 1-32 random characters, so chunk sizes do not follow the
token lengths.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

__all__ = ["GenerationFormat"]


class GenerationFormat:
    """Response shapes of one request (module docstring)."""

    def __init__(
        self,
        route: str,
        model: str,
        request_id: str,
        *,
        include_usage: bool = False,
        obfuscate: bool = False,
    ) -> None:
        self.route = route
        self.model = model
        self.id = ("chatcmpl-" if route == "chat" else "cmpl-") + request_id.replace("-", "")
        self.created = int(time.time())
        self.include_usage = include_usage
        self.obfuscate = obfuscate and route != "native"
        self.offset = 0  # characters of completion text before the next token (text_offset)

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(self, obj: str, choices: list[Any]) -> dict[str, Any]:
        out = {**self._base(obj), "choices": choices}
        if self.include_usage:
            out["usage"] = None
        if self.obfuscate:
            out["obfuscation"] = secrets.token_urlsafe(24)[: 1 + secrets.randbelow(32)]
        return out

    @staticmethod
    def usage(prompt: int, completion: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def logprobs(self, entries: list[Any] | None) -> Any:
        """``entries`` (worker shape) as this route answers them; None when not asked."""
        if entries is None:
            return None
        if self.route == "chat":
            return {"content": entries, "refusal": None}
        tokens, lps, tops, offsets = [], [], [], []
        for e in entries:
            tokens.append(e["token"])
            lps.append(e["logprob"])
            top = {t["token"]: t["logprob"] for t in e.get("top_logprobs") or []}
            top.setdefault(e["token"], e["logprob"])
            tops.append(top)
            offsets.append(self.offset)
            self.offset += len(e["token"])
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def whole(
        self,
        text: str,
        finish: str | None,
        prompt: int,
        completion: int,
        entries: list[Any] | None = None,
    ) -> Any:
        usage = self.usage(prompt, completion)
        lp = self.logprobs(entries)
        if self.route == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": lp,
            }
            return {**self._base("chat.completion"), "choices": [choice], "usage": usage}
        if self.route == "completions":
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": lp}
            return {**self._base("text_completion"), "choices": [choice], "usage": usage}
        return {"model": self.model, "text": text, "finish_reason": finish, "usage": usage}

    def delta(
        self,
        text: str | None,
        finish: str | None,
        *,
        first: bool = False,
        entries: list[Any] | None = None,
    ) -> Any:
        lp = self.logprobs(entries)
        if self.route == "chat":
            d: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text or entries:
                d["content"] = text or ""
            choice = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": lp}
            return self._chunk("chat.completion.chunk", [choice])
        if self.route == "completions":
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": lp}
            return self._chunk("text_completion", [choice])
        return {"model": self.model, "text": text or "", "finish_reason": finish}

    def usage_chunk(self, prompt: int, completion: int) -> Any:
        if self.route == "native":
            return {"model": self.model, "usage": self.usage(prompt, completion)}
        obj = "chat.completion.chunk" if self.route == "chat" else "text_completion"
        return {**self._chunk(obj, []), "usage": self.usage(prompt, completion)}
