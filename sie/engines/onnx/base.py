"""The load every ONNX encoder shares (docs/performance.md "ONNX Runtime engines").

``OnnxEncoderBase.load``, in order:

1. the profile's precision (``sie.engines.onnx.graphs.precision``), threads and int8
   bound are read (a bad one: ``ModelLoadFailed`` CONFIG before any I/O);
2. the weights are found offline (``resolve_weights``) and the torch
   (sentence-transformers) pipeline is loaded on the CPU as the reference; the
   subclass checks it is a shape it reproduces (``_check_reference``);
3. the float32 graph is found or exported (``sie.engines.onnx.graphs.fp32_graph``,
   cached under ``SIE_MODEL_CACHE_DIR``) and opened (``Sessions``);
4. its outputs must match the reference's on the parity probes within cosine
   0.99999 (``sie.engines.onnx.checks.check_parity``; hook ``_check_parity``);
5. with ``compute_precision: int8``, the int8 graph is made (cached beside) and must
   keep the int8 bound against float32 on ``INT8_PROBES`` (hooks ``_int8_bounds``,
   ``_gate_vectors``, ``_check_int8``); loadtime ``int8_activation_scales``
   (``tensor`` or ``token``: ``sie.engines.onnx.quantize``) picks the graph. It then
   serves one text per session call: with per-tensor scales the activations of a
   padded batch share one range, so a text's vector would depend on its neighbours
   (cosine 0.987-0.993 to the same text alone on MiniLM); with per-token scales it
   would not, but batched int8 passes were no faster on 2 cores and waiting for
   company cost the single-text latency (docs/performance.md "Per-token activation
   scales").

The reference is dropped once the checks pass. Subclasses set ``st_class``,
``head`` (the export's cache key and graph), and implement the hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError
from sie.engines.encoders.sentence_transformers import load_st_model, probe_loaded
from sie.engines.onnx.checks import (
    INT8_PROBES,
    Int8Bounds,
    check_int8,
    check_parity,
    parity_probes,
)
from sie.engines.onnx.graphs import (
    export_module,
    fp32_graph,
    int8_graph,
    int8_scales,
    precision,
)
from sie.engines.onnx.runtime import (
    INPUT_NAMES,
    INT8_DISABLED_OPTIMIZERS,
    INT8_PARALLEL_MIN_TOKENS,
    Sessions,
    TextInputs,
    Texts,
)
from sie.engines.options import loadtime_positive_int
from sie.engines.runtime.batching import plan_padding_chunks
from sie.engines.runtime.threads import cpu_cores
from sie.engines.weights import resolve_weights

__all__ = ["OnnxEncoderBase"]

log = logging.getLogger(__name__)

#: Engine calls in flight per core for a one-text-per-pass (int8) engine: one, so that
#: each call runs its passes on its own thread (``Sessions``). Two per core, feeding a
#: shared pass pool, kept that pool busier but cost more GIL hand-offs than it saved
#: (docs/performance.md "Passes on the calling thread").
PASS_SLOTS_PER_CORE = 1


class OnnxEncoderBase:
    """Load, prepare and batching shared by the ONNX encoders (module docstring)."""

    outputs: tuple[str, ...] = ()
    #: Task methods may run on several threads at once: onnxruntime sessions are
    #: thread-safe, the tokenizers are configured once by ``load`` and only read.
    concurrent_calls = 8
    #: The sentence-transformers class of the reference pipeline.
    st_class = "SentenceTransformer"
    #: The export's kind (part of its cache key) and its graph's output name.
    head = "encoder"
    output_name = "token_embeddings"
    #: Whether a ``model.onnx`` the weights ship may serve (its one output must be what
    #: this engine exports).
    shipped_graphs = True
    #: The task named when a probe call on a loaded graph fails.
    task = "encode"
    #: The tokenisation step (pair engines: a subclass that also takes pairs).
    inputs_class: type[TextInputs] = TextInputs

    def __init__(
        self,
        config: ModelConfig,
        profile: ResolvedProfile,
        device: str = "cpu",
        model_cache_dir: str | Path | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self.model_cache_dir = model_cache_dir
        self.precision = "float32"
        self.graph_path: Path | None = None
        self.parity_cosine: float | None = None
        self.int8_quality: Any = None
        #: the int8 graph's activation scales (``tensor`` or ``token``), once loaded
        self.int8_scales: str | None = None
        self._inputs: TextInputs | None = None
        self._sessions: Sessions | None = None
        self._per_text = False
        self._lowercase = False

    # -- hooks ----------------------------------------------------------------------

    def _read_pipeline(self, root: Path) -> None:
        """Read what the graph leaves to numpy from ``root`` (may refuse: CONFIG)."""

    def _check_reference(self, reference: Any) -> None:
        """Refuse (CONFIG) a loaded reference this engine does not reproduce; learn dims."""

    def _export_module(self, reference: Any) -> tuple[Any, str]:
        """``(torch module, key of its output dict)`` to export."""
        raise NotImplementedError

    def _reference_outputs(self, reference: Any, texts: list[str]) -> dict[str, Any]:
        """The reference's outputs for the parity check (``check_parity``'s shape)."""
        raise NotImplementedError

    def _check_outputs(self, texts: list[str]) -> dict[str, Any]:
        """This engine's outputs for the same texts."""
        raise NotImplementedError

    def _gate_vectors(self, texts: list[str]) -> np.ndarray:
        """``[n, d]`` vectors the int8 gate compares."""
        raise NotImplementedError

    def _check_parity(self, reference: Any, window: int) -> str:
        """Check the float32 graph against ``reference`` (raises ``ModelLoadFailed``
        CONFIG); what it measured, for the load's log line. Default: ``check_parity``
        on ``parity_probes``, the worst cosine kept in ``parity_cosine``."""
        self.parity_cosine = check_parity(
            self.config.sie_id,
            lambda texts: self._reference_outputs(reference, texts),
            self._check_outputs,
            parity_probes(window),
        )
        return f"parity cosine {self.parity_cosine:.7f}"

    def _int8_bounds(self, loadtime: Mapping[str, Any]) -> Any:
        """The int8 bound from the profile's loadtime options (raises CONFIG)."""
        return Int8Bounds.from_loadtime(loadtime, self.config.sie_id)

    def _check_int8(self, want: np.ndarray, got: np.ndarray, bounds: Any) -> Any:
        """Measure int8 (``got``) against float32 (``want``) from ``_gate_vectors``;
        raises ``ModelLoadFailed`` CONFIG under ``bounds``."""
        return check_int8(self.config.sie_id, want, got, bounds)

    # -- load -------------------------------------------------------------------------

    def load(self) -> None:
        """Find or export the graph, check it, open the sessions (module docstring).

        Raises:
            ModelLoadFailed: weights not found (NOT_FOUND), a missing package
                (DEPENDENCY), a pipeline, precision or option the engine does not
                serve, a graph that fails its check (CONFIG), or an export,
                quantisation or session failure (UNKNOWN); all permanent.
        """
        sie_id, loadtime = self.config.sie_id, self.profile.loadtime
        self.precision = precision(self.profile, sie_id)
        threads = loadtime_positive_int(loadtime, "intra_op_num_threads", cpu_cores(), sie_id)
        bounds = self._int8_bounds(loadtime)
        scales = int8_scales(self.profile, sie_id)
        root = resolve_weights(self.config)
        self._read_pipeline(root)
        reference = load_st_model(self.config, self.profile, "cpu", self.st_class)
        self._check_reference(reference)
        window = int(reference.max_seq_length or 512)
        inputs = self.inputs_class(root, window, self._lowercase, INPUT_NAMES)
        module, output_key = self._export_module(reference)
        export = export_module(
            module,
            inputs.features(["a", "a padded example of a few words"]),
            INPUT_NAMES,
            self.output_name,
            output_key,
            {"sie_id": sie_id, "engine": type(self).__name__},
        )
        fp32, shipped = fp32_graph(
            self.config,
            self.profile,
            root,
            self.model_cache_dir,
            head=self.head,
            export=export,
            allow_shipped=self.shipped_graphs,
        )
        self._inputs, self._sessions = inputs, Sessions(fp32, self.device, threads)
        parity = self._check_parity(reference, window)
        path = fp32
        if self.precision == "int8":
            want = self._gate_vectors(list(INT8_PROBES))
            path = int8_graph(fp32, shipped, self.model_cache_dir, sie_id, scales)
            self.int8_scales = scales
            self._sessions.close()  # the float32 sessions served the parity check only
            self._sessions = Sessions(
                path, self.device, threads, INT8_PARALLEL_MIN_TOKENS, INT8_DISABLED_OPTIMIZERS
            )
            self._per_text = True
            got = probe_loaded(
                self.config, self.task, lambda: self._gate_vectors(list(INT8_PROBES))
            )
            self.int8_quality = self._check_int8(want, got, bounds)
        self.graph_path = path
        log.info(
            "%s: ONNX %s graph %s (%s%s)",
            sie_id,
            self.precision,
            path.name,
            parity,
            f", int8 {self.int8_quality}" if self.int8_quality else "",
        )

    def unload(self) -> None:
        if self._sessions is not None:
            self._sessions.close()
        self._inputs = None
        self._sessions = None

    def memory_bytes(self) -> int:
        return self._sessions.nbytes if self._sessions is not None else 0

    @property
    def gains_from_batching(self) -> bool:
        """False for int8 (one text per session call): the batcher then sends each item
        as soon as an engine slot is free instead of waiting for company
        (``sie.engines.runtime.batching``)."""
        return not self._per_text

    @property
    def wanted_engine_slots(self) -> int:
        """Engine calls worth running at once (``sie.engines.runtime.threads.engine_slots``):
        one per core of the sessions for int8 (``PASS_SLOTS_PER_CORE``), whose one-text
        passes then run on each call's own thread (``Sessions``), however few calls the
        worker's setting allows; 0 (the worker's setting) otherwise."""
        if not self._per_text or self._sessions is None:
            return 0
        return PASS_SLOTS_PER_CORE * self._sessions.max_threads

    # -- serving ----------------------------------------------------------------------

    def _loaded(self) -> tuple[TextInputs, Sessions]:
        """Raises InferenceError when not loaded."""
        if self._inputs is None or self._sessions is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        return self._inputs, self._sessions

    def prepare(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        is_query: bool,
        options: Mapping[str, Any],
    ) -> tuple[list[str], list[int]]:
        """``EncodeEngine.prepare`` (``TextInputs.prepare``)."""
        inputs, _ = self._loaded()
        return inputs.prepare(
            texts,
            instruction=instruction,
            is_query=is_query,
            options=options,
            sie_id=self.config.sie_id,
        )

    def _chunks(self, texts: Texts, lengths: Sequence[int] | None) -> list[list[int]]:
        """One text per call for int8 (module docstring); else length-bucketed forward
        passes (``plan_padding_chunks``): less padding, same vectors."""
        inputs, _ = self._loaded()
        if self._per_text:
            return [[i] for i in range(len(texts))]
        if len(texts) <= 8:
            return [list(range(len(texts)))]
        return plan_padding_chunks(lengths or inputs.counts(texts))

    def _encode_pairs(
        self,
        pairs: Sequence[tuple[str, str]],
        instruction: str | None,
        options: Mapping[str, Any],
        output: str,
        encode_options: Mapping[str, Any],
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``score``'s inputs: each distinct query (rendered with ``is_query`` and the
        instruction) and each distinct doc encoded once, in one call, as ``output``;
        returns (query → vector, doc → vector)."""
        queries = sorted({q for q, _ in pairs})
        docs = sorted({d for _, d in pairs})
        q_in, _ = self.prepare(queries, instruction=instruction, is_query=True, options=options)
        d_in, _ = self.prepare(docs, instruction=None, is_query=False, options=options)
        encode: Any = getattr(self, "encode")  # noqa: B009 - each engine defines it
        vecs = encode([*q_in, *d_in], output_types=(output,), options=encode_options)[output]
        n = len(queries)
        return dict(zip(queries, vecs[:n], strict=True)), dict(zip(docs, vecs[n:], strict=True))
