"""Cross-encoder rerankers (bundle module ``sie.engines.scorers.cross_encoder``).

``CrossEncoderScorer``: sentence-transformers ``CrossEncoder`` → one relevance
score per ``(query, doc)`` pair (docs/api.md §3), read jointly by the model.
Profile options: loadtime ``trust_remote_code``; runtime ``activation``:
``"none"`` (default, the raw logit) or ``"sigmoid"`` (logit squashed into (0, 1),
same order). ``instruction`` is prepended to each query as ``f"{instruction} {query}"``.
The config's ``max_sequence_length`` caps the tokens of a pair (query and doc
together, longest-first truncation); unset, the tokenizer's ``model_max_length``.

Note: ``CrossEncoder.predict`` in sentence-transformers 6.x applies
``nn.Sigmoid()`` by default to single-label (``num_labels=1``) models unless the
saved config names another ``activation_fn``. This engine never relies on that
default: it always passes the activation explicitly (``nn.Identity()`` for
``"none"``), so a model's scores do not change with the library's default or the
checkpoint's saved activation.
torch and sentence-transformers are imported in ``load`` only (extra ``st``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.engines.encoders.sentence_transformers import load_st_model, probe_loaded
from sie.engines.tokens import torch_bytes

__all__ = ["ACTIVATIONS", "CrossEncoderScorer", "activation_option"]

#: Values of the runtime option ``activation``; the first is the default.
ACTIVATIONS = ("none", "sigmoid")
#: Most pairs in one forward pass (``predict``'s ``batch_size``).
MAX_PREDICT_BATCH = 64


def activation_option(options: Mapping[str, Any]) -> str:
    """The runtime option ``activation`` (one of ``ACTIVATIONS``; unset or null: the first).

    Raises:
        InvalidInput: any other value (field ``params.options.activation``).
    """
    value = options.get("activation", ACTIVATIONS[0])
    if value is None:
        return ACTIVATIONS[0]
    if not isinstance(value, str) or value not in ACTIVATIONS:
        raise InvalidInput(
            f"params.options.activation must be one of {list(ACTIVATIONS)}, got {value!r}",
            field="params.options.activation",
        )
    return value


class CrossEncoderScorer:
    """Query-document relevance from a sentence-transformers cross-encoder directory."""

    #: ``score`` may run on several threads at once (sie.engines.runtime.threads): the model is
    #: in inference mode and ``load``'s warm-up call fixes the tokenizer's settings.
    concurrent_calls = 8

    def __init__(self, config: ModelConfig, profile: ResolvedProfile, device: str = "cpu") -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self._model: Any = None
        self._activations: dict[str, Any] = {}

    def load(self) -> None:
        model = load_st_model(
            self.config,
            self.profile,
            self.device,
            "CrossEncoder",
            max_length=self.config.max_sequence_length or None,
        )
        import torch

        if model.num_labels != 1:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: a reranker needs a single-logit head, "
                f"but the weights have num_labels={model.num_labels}",
                error_class="CONFIG",
                permanent=True,
            )
        model.eval()
        self._activations = {"none": torch.nn.Identity(), "sigmoid": torch.nn.Sigmoid()}
        # warm-up: torch's lazy init, and the tokenizer's settings, before any request
        probe_loaded(
            self.config, "score", lambda: model.predict([["warm", "up"]], show_progress_bar=False)
        )
        self._model = model

    def unload(self) -> None:
        self._model = None
        self._activations = {}

    def memory_bytes(self) -> int:
        return torch_bytes(self._model)

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        instruction: str | None,
        options: Mapping[str, Any],
    ) -> list[float]:
        """One score per pair, in input order (higher is more relevant).

        The distinct pairs go to one ``predict`` call (``batch_size`` = their number, at
        most ``MAX_PREDICT_BATCH``); padding is masked, so a pair's score does not depend
        on the other pairs (up to float rounding: CPU kernels can round a row differently
        by its place in the batch, which is why equal pairs are scored once and always
        tie exactly).

        Raises:
            InvalidInput: ``activation`` is not one of ``ACTIVATIONS``.
            InferenceError: not loaded, or the forward pass failed.
        """
        activation = activation_option(options)
        if self._model is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        if not pairs:
            return []
        slots: dict[tuple[str, str], int] = {}
        order = [slots.setdefault((q, d), len(slots)) for q, d in pairs]
        inputs = [[f"{instruction} {q}" if instruction is not None else q, d] for q, d in slots]
        try:
            scores = self._model.predict(
                inputs,
                batch_size=min(len(inputs), MAX_PREDICT_BATCH),
                show_progress_bar=False,
                activation_fn=self._activations[activation],
                convert_to_numpy=True,
            )
        except Exception as exc:
            raise InferenceError(f"score failed: {exc}") from exc
        distinct = [float(s) for s in scores.reshape(-1)]
        if len(distinct) != len(inputs):
            raise InferenceError(f"score returned {len(distinct)} scores for {len(inputs)} pairs")
        return [distinct[i] for i in order]
