"""Token-classification NER on ONNX Runtime (bundle module ``sie.engines.extractors.token_classification``).

``OnnxTokenClassifier``: a directory (found by ``resolve_weights``) holding
``config.json`` (``id2label`` with BIO tags such as ``B-GIVEN_NAME``), ``tokenizer.json``
(Hugging Face ``tokenizers``) and an ONNX graph taking ``input_ids`` /
``attention_mask`` / ``token_type_ids`` (int64 ``[batch, seq]``) and returning logits
``[batch, seq, num_labels]`` → per text a list of ``Entity`` (docs/api.md §4).

Options:
    loadtime ``onnx_file`` (path inside the directory; default ``onnx/model_q4.onnx``,
    then ``model.onnx``, then ``onnx/model.onnx``), ``intra_op_num_threads`` (int > 0;
    default the CPU count capped at 4), ``batch_size`` (int > 0, default 32: windows
    per ONNX call).
    runtime ``threshold`` (number in 0..1, default 0.0): entities whose score is below
    it are dropped.

Windows: a text is tokenised once, without special tokens. When its tokens exceed the
model window (``max_position_embeddings``, the tokenizer's ``model_max_length`` and
the config's ``max_sequence_length``, whichever is least, minus the special tokens)
it is read in windows of that many tokens, each overlapping the next by a quarter.
Every token takes its prediction from the window in which it lies farthest from a cut
edge (the text's own ends are not cut edges), so each token is judged with the most
context and spans are built once over the whole text: nothing to deduplicate.

Spans (the merging rule): special tokens (and zero-width tokens) are never part of an
entity and end any open one; ``O`` ends an open entity. ``I-X`` (also ``E-X``/``L-X``
or a bare ``X``) continues an open entity of type ``X``, else starts one. ``B-X``
(also ``S-X``/``U-X``) starts a new entity, except that it continues an open entity
of type ``X`` when no whitespace separates it from the previous token: models that
tag every word piece ``B-`` (``smith`` ``##ers``, the pieces of an e-mail address)
give one entity per written word, while two adjacent ``B-`` words stay two entities.
An entity's label is its tag type (``GIVEN_NAME``), its score the mean of its tokens'
softmax probabilities for their predicted tags, its offsets Python character offsets
into the original text, trimmed of whitespace.

onnxruntime, tokenizers and numpy are imported in ``load`` only (extra ``extract``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.engines.base import Entity
from sie.engines.options import loadtime_positive_int, runtime_fraction
from sie.engines.weights import resolve_weights

__all__ = ["OnnxTokenClassifier"]

DEFAULT_ONNX_FILES = ("onnx/model_q4.onnx", "model.onnx", "onnx/model.onnx")
DEFAULT_BATCH_SIZE = 32
DEFAULT_THRESHOLD = 0.0
FALLBACK_MAX_TOKENS = 512
_BEGIN = frozenset({"B", "S", "U"})
_INSIDE = frozenset({"I", "E", "L"})


@dataclass
class _Text:
    """One input text, tokenised without special tokens."""

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    skip: list[bool]  # special or zero-width: never part of an entity
    probs: Any = None  # float32 [n, num_labels]
    reach: Any = None  # per token: distance to the nearest cut edge of its window
    windows: list[tuple[int, int]] = field(default_factory=list)


def _split_tag(tag: str) -> tuple[str, str | None]:
    """``"B-CITY"`` → ``("B", "CITY")``; ``"O"`` → ``("O", None)``; a bare ``"CITY"``
    (IO scheme) → ``("I", "CITY")``."""
    if tag in ("O", ""):
        return "O", None
    head, sep, tail = tag.partition("-")
    if sep and tail and head.upper() in _BEGIN | _INSIDE:
        return ("B" if head.upper() in _BEGIN else "I"), tail
    return "I", tag


class OnnxTokenClassifier:
    """Fixed-label NER from an ONNX token-classification model (docs/api.md §4)."""

    def __init__(self, config: ModelConfig, profile: ResolvedProfile, device: str = "cpu") -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self._session: Any = None
        self._tokenizer: Any = None
        self._np: Any = None
        self._tags: list[tuple[str, str | None]] = []
        self._onnx_path: Path | None = None
        self._window = 0
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        self._prefix_types: list[int] = []
        self._suffix_types: list[int] = []
        self._content_type = 0
        self._pad_id = 0
        self._special_ids: frozenset[int] = frozenset()
        self._feeds: dict[str, str] = {}
        self._output = ""
        self._batch_size = DEFAULT_BATCH_SIZE

    # -- lifecycle ---------------------------------------------------------------

    def load(self) -> None:
        """Open the ONNX session and the tokenizer.

        Raises:
            ModelLoadFailed: weights or a required file not found (NOT_FOUND),
                onnxruntime/tokenizers missing (DEPENDENCY), bad options or a config
                without ``id2label`` (CONFIG), or an unloadable graph.
        """
        sie_id = self.config.sie_id
        loadtime = self.profile.loadtime
        threads = loadtime_positive_int(
            loadtime, "intra_op_num_threads", min(os.cpu_count() or 1, 4), sie_id
        )
        batch_size = loadtime_positive_int(loadtime, "batch_size", DEFAULT_BATCH_SIZE, sie_id)
        root = resolve_weights(self.config)
        try:
            import numpy as np
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelLoadFailed(
                f"cannot import the ONNX stack ({exc}); pip install 'sie[extract]'",
                error_class="DEPENDENCY",
                permanent=True,
            ) from exc
        cfg = self._read_json(root / "config.json", required=True)
        id2label = cfg.get("id2label")
        if not isinstance(id2label, dict) or not id2label:
            raise ModelLoadFailed(
                f"model {sie_id!r}: {str(root / 'config.json')!r} has no id2label",
                error_class="CONFIG",
                permanent=True,
            )
        try:
            tags = [_split_tag(str(id2label[k])) for k in sorted(id2label, key=int)]
            if [int(k) for k in sorted(id2label, key=int)] != list(range(len(tags))):
                raise ValueError("ids are not 0..n-1")
        except (ValueError, TypeError) as exc:
            raise ModelLoadFailed(
                f"model {sie_id!r}: id2label in config.json is malformed ({exc})",
                error_class="CONFIG",
                permanent=True,
            ) from exc
        onnx_path = self._onnx_file(root, loadtime.get("onnx_file"))
        tok_path = root / "tokenizer.json"
        if not tok_path.is_file():
            raise ModelLoadFailed(
                f"model {sie_id!r}: no tokenizer.json in {str(root)!r}",
                error_class="NOT_FOUND",
                permanent=True,
            )
        try:
            tokenizer = Tokenizer.from_file(str(tok_path))
            tokenizer.no_truncation()
            tokenizer.no_padding()
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            session = ort.InferenceSession(
                str(onnx_path), sess_options=opts, providers=self._providers(ort)
            )
        except Exception as exc:  # onnxruntime/tokenizers raise their own exception types
            raise ModelLoadFailed(
                f"loading {sie_id!r} from {str(root)!r} failed: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        inputs = {i.name: i.type for i in session.get_inputs()}
        known = {"input_ids", "attention_mask", "token_type_ids"}
        if "input_ids" not in inputs or set(inputs) - known:
            raise ModelLoadFailed(
                f"model {sie_id!r}: ONNX inputs {sorted(inputs)} are not "
                f"input_ids[/attention_mask/token_type_ids]",
                error_class="CONFIG",
                permanent=True,
            )
        outputs = session.get_outputs()
        out = next((o for o in outputs if o.name == "logits"), outputs[0])
        width = out.shape[-1] if out.shape else None
        if isinstance(width, int) and width != len(tags):
            raise ModelLoadFailed(
                f"model {sie_id!r}: the graph has {width} labels but id2label {len(tags)}",
                error_class="CONFIG",
                permanent=True,
            )
        self._np = np
        self._tags = tags
        self._tokenizer = tokenizer
        self._session = session
        self._onnx_path = onnx_path
        self._feeds = dict(inputs)
        self._output = out.name
        self._batch_size = batch_size
        self._pad_id = int(cfg.get("pad_token_id") or 0)
        self._setup_specials(tokenizer, root, cfg)

    def unload(self) -> None:
        self._session = None
        self._tokenizer = None

    def memory_bytes(self) -> int:
        """Bytes of the ONNX graph file(s) (external data included); 0 when unloaded."""
        if self._session is None or self._onnx_path is None:
            return 0
        p = self._onnx_path
        files = [p, p.with_name(p.name + "_data"), p.with_name(p.name + ".data")]
        return sum(f.stat().st_size for f in files if f.is_file())

    # -- load helpers ----------------------------------------------------------------

    def _read_json(self, path: Path, *, required: bool) -> dict[str, Any]:
        if not path.is_file():
            if required:
                raise ModelLoadFailed(
                    f"model {self.config.sie_id!r}: {str(path)!r} not found",
                    error_class="NOT_FOUND",
                    permanent=True,
                )
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: cannot read {str(path)!r}: {exc}",
                error_class="CONFIG",
                permanent=True,
            ) from exc
        return data if isinstance(data, dict) else {}

    def _onnx_file(self, root: Path, configured: Any) -> Path:
        if configured is not None and not isinstance(configured, str):
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: loadtime.onnx_file must be a string",
                error_class="CONFIG",
                permanent=True,
            )
        candidates = [configured] if configured else list(DEFAULT_ONNX_FILES)
        for name in candidates:
            p = (root / name).resolve()
            if p.is_file() and p.is_relative_to(root.resolve()):
                return p
        raise ModelLoadFailed(
            f"model {self.config.sie_id!r}: no ONNX file in {str(root)!r}; tried {candidates}",
            error_class="NOT_FOUND",
            permanent=True,
            tried=candidates,
        )

    def _providers(self, ort: Any) -> list[Any]:
        if self.device.startswith("cuda") and "CUDAExecutionProvider" in (
            ort.get_available_providers()
        ):
            _, _, idx = self.device.partition(":")
            return [
                ("CUDAExecutionProvider", {"device_id": int(idx or 0)}),
                "CPUExecutionProvider",
            ]
        return ["CPUExecutionProvider"]

    def _setup_specials(self, tokenizer: Any, root: Path, cfg: Mapping[str, Any]) -> None:
        """The special tokens the post-processor wraps a sequence in, and the window."""
        probe = tokenizer.encode("a", add_special_tokens=True)
        content = [i for i, m in enumerate(probe.special_tokens_mask) if not m]
        first, last = (content[0], content[-1]) if content else (len(probe.ids), len(probe.ids))
        self._prefix, self._suffix = list(probe.ids[:first]), list(probe.ids[last + 1 :])
        self._prefix_types = list(probe.type_ids[:first])
        self._suffix_types = list(probe.type_ids[last + 1 :])
        self._content_type = int(probe.type_ids[first]) if content else 0
        self._special_ids = frozenset(
            int(tid)
            for tid, tok in tokenizer.get_added_tokens_decoder().items()
            if getattr(tok, "special", False)
        ) | frozenset(self._prefix + self._suffix)
        limits = [FALLBACK_MAX_TOKENS]
        mpe = cfg.get("max_position_embeddings")
        if isinstance(mpe, int) and mpe > 0:
            limits = [mpe]
        mml = self._read_json(root / "tokenizer_config.json", required=False).get(
            "model_max_length"
        )
        if isinstance(mml, int) and 0 < mml < 10**6:
            limits.append(mml)
        if self.config.max_sequence_length:
            limits.append(self.config.max_sequence_length)
        self._window = max(1, min(limits) - len(self._prefix) - len(self._suffix))

    # -- extract ---------------------------------------------------------------------

    def extract(
        self,
        texts: Sequence[str],
        *,
        labels: Sequence[str] | None,
        options: Mapping[str, Any],
    ) -> list[list[Entity]]:
        """Entities per text, in input order, each list sorted by ``start`` (docs/api.md §4).

        Each entity is ``{"text", "label", "score", "start", "end"}``: ``label`` a tag
        type of the model (``GIVEN_NAME``), ``score`` in 0..1, ``start``/``end`` Python
        character offsets with ``text == original[start:end]``. ``labels``, when given
        and non-empty, keeps only entities whose label is one of them (compared
        case-insensitively; a label the model does not know simply finds nothing).

        Raises:
            InvalidInput: ``labels`` not a list of strings (field ``params.labels``),
                or a bad ``threshold`` (field ``params.options.threshold``).
            InferenceError: not loaded, or the ONNX run failed.
        """
        keep = self._label_filter(labels)
        threshold = runtime_fraction(
            {**self.profile.runtime, **options}, "threshold", DEFAULT_THRESHOLD
        )
        if self._session is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        docs = self._tokenize(texts)
        self._run(docs)
        out: list[list[Entity]] = []
        for doc in docs:
            ents = [
                e
                for e in self._spans(doc)
                if e["score"] >= threshold and (keep is None or e["label"].casefold() in keep)
            ]
            out.append(sorted(ents, key=lambda e: (e["start"], e["end"], e["label"])))
        return out

    @staticmethod
    def _label_filter(labels: Sequence[str] | None) -> frozenset[str] | None:
        if labels is None:
            return None
        if isinstance(labels, str) or not all(isinstance(x, str) for x in labels):
            raise InvalidInput("params.labels must be a list of strings", field="params.labels")
        return frozenset(x.casefold() for x in labels) or None

    def _tokenize(self, texts: Sequence[str]) -> list[_Text]:
        encs = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        docs: list[_Text] = []
        for text, enc in zip(texts, encs, strict=True):
            offsets = [(int(s), int(e)) for s, e in enc.offsets]
            skip = [
                bool(m) or s >= e or tid in self._special_ids
                for tid, m, (s, e) in zip(enc.ids, enc.special_tokens_mask, offsets, strict=True)
            ]
            doc = _Text(text, list(enc.ids), offsets, skip)
            n, w = len(doc.ids), self._window
            if n:
                step = max(1, w - w // 4)
                a = 0
                while True:
                    doc.windows.append((a, min(a + w, n)))
                    if a + w >= n:
                        break
                    a += step
            docs.append(doc)
        return docs

    def _run(self, docs: list[_Text]) -> None:
        """One padded ONNX call per ``batch_size`` windows (windows sorted by length);
        fills each text's per-token probabilities from its best-placed window."""
        np = self._np
        jobs = [(d, a, b) for d in docs for a, b in d.windows]
        jobs.sort(key=lambda j: j[2] - j[1])
        for d in docs:
            d.probs = np.zeros((len(d.ids), len(self._tags)), dtype=np.float32)
            d.reach = np.full(len(d.ids), -1, dtype=np.int64)
        pre, suf = len(self._prefix), len(self._suffix)
        for at in range(0, len(jobs), self._batch_size):
            chunk = jobs[at : at + self._batch_size]
            width = pre + suf + max(b - a for _, a, b in chunk)
            ids = np.full((len(chunk), width), self._pad_id, dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            types = np.zeros((len(chunk), width), dtype=np.int64)
            for r, (d, a, b) in enumerate(chunk):
                row = [*self._prefix, *d.ids[a:b], *self._suffix]
                ids[r, : len(row)] = row
                mask[r, : len(row)] = 1
                types[r, : len(row)] = [
                    *self._prefix_types,
                    *[self._content_type] * (b - a),
                    *self._suffix_types,
                ]
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            try:
                logits = self._session.run(
                    [self._output],
                    {
                        name: feed[name].astype(np.int32 if "int32" in kind else np.int64)
                        for name, kind in self._feeds.items()
                    },
                )[0]
            except Exception as exc:
                raise InferenceError(f"ONNX token classification failed: {exc}") from exc
            logits = np.asarray(logits, dtype=np.float32)
            if logits.ndim != 3 or logits.shape[-1] != len(self._tags):
                raise InferenceError(
                    f"ONNX output shape {logits.shape} does not match "
                    f"[batch, seq, {len(self._tags)}]"
                )
            logits = logits - logits.max(axis=-1, keepdims=True)
            probs = np.exp(logits)
            probs /= probs.sum(axis=-1, keepdims=True)
            for r, (d, a, b) in enumerate(chunk):
                n = len(d.ids)
                pos = np.arange(a, b)
                big = n + 1  # the text's own ends are not cut edges
                reach = np.minimum(
                    pos - a if a > 0 else np.full(b - a, big),
                    b - 1 - pos if b < n else np.full(b - a, big),
                )
                better = reach > d.reach[a:b]
                d.reach[a:b] = np.where(better, reach, d.reach[a:b])
                d.probs[a:b][better] = probs[r, pre : pre + (b - a)][better]

    def _spans(self, doc: _Text) -> list[Entity]:
        """The merging rule of the module docstring over one text's token tags."""
        if not doc.ids:
            return []
        tags = doc.probs.argmax(axis=-1).tolist()
        scores = doc.probs.max(axis=-1).tolist()
        text = doc.text
        out: list[Entity] = []
        cur: list[int] = []  # token indices of the open entity
        cur_type: str | None = None

        def close() -> None:
            nonlocal cur, cur_type
            if cur and cur_type is not None:
                start, end = doc.offsets[cur[0]][0], doc.offsets[cur[-1]][1]
                while start < end and text[start].isspace():
                    start += 1
                while end > start and text[end - 1].isspace():
                    end -= 1
                if start < end:
                    out.append(
                        Entity(
                            text=text[start:end],
                            label=cur_type,
                            score=float(sum(scores[i] for i in cur) / len(cur)),
                            start=start,
                            end=end,
                        )
                    )
            cur, cur_type = [], None

        for i in range(len(doc.ids)):
            kind, typ = ("O", None) if doc.skip[i] else self._tags[tags[i]]
            if kind == "O" or typ is None:
                close()
                continue
            if cur and cur_type == typ:
                gap = text[doc.offsets[cur[-1]][1] : doc.offsets[i][0]]
                if kind == "I" or not any(c.isspace() for c in gap):
                    cur.append(i)
                    continue
            close()
            cur, cur_type = [i], typ
        close()
        return out
