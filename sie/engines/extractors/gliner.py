"""GLiNER zero-shot entity extraction (bundle module ``sie.engines.extractors.gliner``).

``GlinerExtractor``: a GLiNER model directory (``save_pretrained`` layout, found by
``resolve_weights``) → per text a list of ``Entity`` (docs/api.md §4).

Options:
    loadtime ``batch_size`` (int > 0, default 8): windows per forward pass.
    runtime ``threshold`` (number in 0..1, default 0.5): minimum span score;
    ``flat_ner`` (bool, default true): no overlapping spans; ``multi_label`` (bool,
    default false): one span may carry several labels (docs/api.md §4).

Long texts: GLiNER reads at most ``config.max_len`` words and its encoder at most
``model_max_length`` subword tokens (label prompt included); beyond that the library
truncates silently. The engine therefore splits each text, on the model's own word
boundaries, into windows that fit both limits, overlapping by at least twice the
maximum span width (``config.max_width``) words. A span is kept only from the window
that owns its start (windows own the text up to the middle of their overlap with the
next one), so each span is judged where it has context on both sides; the union is
then decoded again (``flat_ner``/``multi_label`` greedy rule, highest score first),
exactly as GLiNER decodes one window. Offsets always index the whole original text.

torch and gliner are imported in ``load`` only (gliner is installed ``--no-deps`` beside
the ``st`` extra; see the Makefile).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.engines.base import Entity
from sie.engines.options import loadtime_positive_int, runtime_bool, runtime_fraction
from sie.engines.tokens import counting_tokenizer, torch_bytes
from sie.engines.weights import resolve_weights

__all__ = ["GlinerExtractor"]

DEFAULT_THRESHOLD = 0.5
DEFAULT_BATCH_SIZE = 8
#: Subword window when neither the tokenizer nor the encoder config names one.
FALLBACK_MAX_TOKENS = 512


@dataclass(frozen=True)
class _Window:
    text_index: int
    char_start: int  # where the window's text starts in the original
    char_end: int
    own_start: int  # spans starting in [own_start, own_end) are kept from this window
    own_end: int


def _check_labels(labels: Sequence[str] | None) -> list[str]:
    """Distinct labels in request order.

    Raises:
        InvalidInput: (field ``params.labels``) missing, empty or not non-empty strings.
    """
    if labels is None or isinstance(labels, str) or len(labels) == 0:
        raise InvalidInput(
            "params.labels is required for this model (a non-empty list of entity types)",
            field="params.labels",
        )
    if not all(isinstance(x, str) and x.strip() for x in labels):
        raise InvalidInput(
            "params.labels must be a list of non-empty strings", field="params.labels"
        )
    return list(dict.fromkeys(labels))


def _conflicts(a: Entity, b: Entity, *, flat_ner: bool, multi_label: bool) -> bool:
    """GLiNER's decoding rule in character space (half-open spans): the same span
    conflicts unless ``multi_label``; otherwise overlapping spans conflict, and
    under nested decoding (``flat_ner`` false) only when neither contains the other."""
    if a["start"] == b["start"] and a["end"] == b["end"]:
        return not multi_label
    if a["end"] <= b["start"] or b["end"] <= a["start"]:
        return False
    if flat_ner:
        return True
    nested = (a["start"] <= b["start"] and b["end"] <= a["end"]) or (
        b["start"] <= a["start"] and a["end"] <= b["end"]
    )
    return not nested


def _decode(entities: list[Entity], *, flat_ner: bool, multi_label: bool) -> list[Entity]:
    """Greedy, highest score first (GLiNER ``greedy_search``); result sorted by start."""
    best: dict[tuple[int, int, str], Entity] = {}
    for e in entities:
        key = (e["start"], e["end"], e["label"])
        if key not in best or e["score"] > best[key]["score"]:
            best[key] = e
    kept: list[Entity] = []
    for e in sorted(best.values(), key=lambda x: (-x["score"], x["start"], x["end"])):
        if not any(_conflicts(e, k, flat_ner=flat_ner, multi_label=multi_label) for k in kept):
            kept.append(e)
    kept.sort(key=lambda x: (x["start"], x["end"], x["label"]))
    return kept


class GlinerExtractor:
    """Zero-shot entities from a GLiNER model (docs/api.md §4); ``labels`` are required."""

    def __init__(self, config: ModelConfig, profile: ResolvedProfile, device: str = "cpu") -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self._model: Any = None
        self._counter: Any = None
        self._batch_size = DEFAULT_BATCH_SIZE

    # -- lifecycle ---------------------------------------------------------------

    def load(self) -> None:
        """Load the GLiNER directory onto ``device``.

        Raises:
            ModelLoadFailed: weights not found (NOT_FOUND), gliner not installed
                (DEPENDENCY), a bad loadtime option (CONFIG) or an unloadable directory.
        """
        batch_size = loadtime_positive_int(
            self.profile.loadtime, "batch_size", DEFAULT_BATCH_SIZE, self.config.sie_id
        )
        path = resolve_weights(self.config)
        try:
            from gliner import GLiNER
        except ImportError as exc:
            raise ModelLoadFailed(
                "gliner is not installed (pip install --no-deps gliner; see the Makefile)",
                error_class="DEPENDENCY",
                permanent=True,
            ) from exc
        try:
            model = GLiNER.from_pretrained(
                str(path), local_files_only=True, map_location=self.device
            )
            model.to(self.device)
            model.eval()
        except Exception as exc:  # the library raises OSError/ValueError/RuntimeError variously
            raise ModelLoadFailed(
                f"loading {self.config.sie_id!r} from {str(path)!r} failed: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        processor = getattr(model, "data_processor", None)
        if processor is None or getattr(processor, "transformer_tokenizer", None) is None:
            raise ModelLoadFailed(
                f"{str(path)!r} loaded without a tokenizer; cannot window long texts",
                error_class="UNKNOWN",
                permanent=True,
            )
        self._counter = counting_tokenizer(processor.transformer_tokenizer)
        self._batch_size = batch_size
        self._model = model

    def unload(self) -> None:
        self._model = None
        self._counter = None

    def memory_bytes(self) -> int:
        """Parameter plus buffer bytes of the loaded torch model (0 when unloaded)."""
        return torch_bytes(self._model)

    # -- limits --------------------------------------------------------------------

    def _max_words(self) -> int:
        return max(1, int(getattr(self._model.config, "max_len", 384) or 384))

    def _max_width(self) -> int:
        return max(1, int(getattr(self._model.config, "max_width", 12) or 12))

    def _max_tokens(self) -> int:
        """Subword tokens the encoder reads (specials included)."""
        limits = [FALLBACK_MAX_TOKENS]
        tok = self._model.data_processor.transformer_tokenizer
        mml = getattr(tok, "model_max_length", None)
        if isinstance(mml, int) and 0 < mml < 10**6:
            limits = [mml]
        enc = getattr(self._model.config, "encoder_config", None)
        mpe = getattr(enc, "max_position_embeddings", None)
        if isinstance(mpe, int) and mpe > 0:
            limits.append(mpe)
        if self.config.max_sequence_length:
            limits.append(self.config.max_sequence_length)
        return min(limits)

    def _subword_counts(self, words: list[str]) -> list[int]:
        """Subword tokens of each word, as the encoder reads them (no specials)."""
        counts = [0] * len(words)
        if not words:
            return counts
        if self._counter is not None:
            word_ids = self._counter.encode(
                words, is_pretokenized=True, add_special_tokens=False
            ).word_ids
        else:
            tok = self._model.data_processor.transformer_tokenizer
            word_ids = tok(words, is_split_into_words=True, add_special_tokens=False).word_ids()
        for wid in word_ids:
            if wid is not None:
                counts[wid] += 1
        return counts

    def _prompt_words(self, labels: list[str]) -> list[str]:
        """The words GLiNER puts before the text for these labels (empty for
        bi-encoders, whose labels are encoded apart)."""
        processor = self._model.data_processor
        try:
            texts, _ = processor.prepare_inputs([[]], labels)
            return [str(w) for w in texts[0]]
        except Exception:  # a processor variant with another signature: estimate
            cfg = self._model.config
            ent, sep = getattr(cfg, "ent_token", "<<ENT>>"), getattr(cfg, "sep_token", "<<SEP>>")
            return [w for label in labels for w in (ent, label)] + [sep]

    def _token_budget(self, labels: list[str]) -> int:
        """Subword tokens left for text words in one window.

        Raises:
            InvalidInput: the label prompt alone fills the encoder window.
        """
        tok = self._model.data_processor.transformer_tokenizer
        prompt = self._prompt_words(labels)
        prompt_tokens = sum(self._subword_counts(prompt))
        specials = int(tok.num_special_tokens_to_add(pair=False))
        budget = self._max_tokens() - specials - prompt_tokens
        if budget < self._max_width():
            raise InvalidInput(
                f"params.labels: the label prompt takes {prompt_tokens} of the model's "
                f"{self._max_tokens()} tokens, leaving no room for text; send fewer labels",
                field="params.labels",
            )
        return budget

    # -- windows -------------------------------------------------------------------

    def _windows(self, index: int, text: str, budget: int) -> list[_Window]:
        """Overlapping word windows of ``text`` within ``max_len`` words and ``budget``
        subword tokens (a single over-long word gets a window of its own)."""
        processor = self._model.data_processor
        words = [(int(s), int(e)) for _, s, e in processor.words_splitter(text)]
        if not words:
            return []
        counts = self._subword_counts([text[s:e] for s, e in words])
        prefix = [0]
        for c in counts:
            prefix.append(prefix[-1] + c)

        max_words, max_width, n = self._max_words(), self._max_width(), len(words)

        def fits(a: int, b: int) -> bool:  # words [a, b)
            return b - a <= max_words and prefix[b] - prefix[a] <= budget

        spans: list[tuple[int, int]] = []
        a = 0
        while True:
            b = a + 1
            while b < n and fits(a, b + 1):
                b += 1
            spans.append((a, b))
            if b >= n:
                break
            overlap = max(2 * max_width, (b - a) // 4)
            nxt = max(a + 1, b - overlap)
            while nxt < b and not fits(nxt, b + 1):  # the next window must reach word b
                nxt += 1
            a = nxt
        cuts = [0]
        for (_, b0), (a1, _) in itertools.pairwise(spans):
            cuts.append(words[(a1 + b0) // 2][0])
        cuts.append(len(text) + 1)
        return [
            _Window(index, words[a][0], words[b - 1][1], cuts[k], cuts[k + 1])
            for k, (a, b) in enumerate(spans)
        ]

    # -- extract -------------------------------------------------------------------

    def extract(
        self,
        texts: Sequence[str],
        *,
        labels: Sequence[str] | None,
        options: Mapping[str, Any],
    ) -> list[list[Entity]]:
        """Entities per text, in input order, each list sorted by ``start`` (docs/api.md §4).

        Each entity is ``{"text", "label", "score", "start", "end"}``: ``label`` one of
        ``labels``, ``score`` in 0..1 (≥ ``threshold``), ``start``/``end`` Python
        character offsets into the original text with ``text == original[start:end]``.

        Raises:
            InvalidInput: ``labels`` missing or empty (field ``params.labels``), an
                option of the wrong type or range (field ``params.options.<name>``).
            InferenceError: not loaded, or the forward pass failed.
        """
        merged = {**self.profile.runtime, **options}
        wanted = _check_labels(labels)
        threshold = runtime_fraction(merged, "threshold", DEFAULT_THRESHOLD)
        flat_ner = runtime_bool(merged, "flat_ner", True)
        multi_label = runtime_bool(merged, "multi_label", False)
        if self._model is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        budget = self._token_budget(wanted)
        windows = [w for i, t in enumerate(texts) for w in self._windows(i, t, budget)]
        found: list[list[Entity]] = [[] for _ in texts]
        if not windows:
            return found
        try:
            raw = self._model.inference(
                [texts[w.text_index][w.char_start : w.char_end] for w in windows],
                wanted,
                flat_ner=flat_ner,
                threshold=threshold,
                multi_label=multi_label,
                batch_size=self._batch_size,
            )
        except Exception as exc:
            raise InferenceError(f"GLiNER inference failed: {exc}") from exc
        for w, spans in zip(windows, raw, strict=True):
            original = texts[w.text_index]
            for span in spans:
                start = w.char_start + int(span["start"])
                end = w.char_start + int(span["end"])
                if not w.own_start <= start < w.own_end or not start < end <= w.char_end:
                    continue
                found[w.text_index].append(
                    Entity(
                        text=original[start:end],
                        label=str(span["label"]),
                        score=float(span["score"]),
                        start=start,
                        end=end,
                    )
                )
        return [_decode(f, flat_ner=flat_ner, multi_label=multi_label) for f in found]
