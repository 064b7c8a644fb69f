"""Tokenisation and ONNX Runtime sessions for the ONNX engines.

``TextInputs``: the model's ``tokenizer.json`` (Hugging Face ``tokenizers``, the Rust
tokenizer the torch path uses too), configured once at load: one copy pads to the
longest text of a batch and truncates to the window (``longest_first``, right), one
copy counts tokens (no padding, no truncation). Both are only read afterwards, so
concurrent calls are safe. ``prepare`` renders templates and bounds long inputs as
``DenseEncoder.prepare`` does (docs/api.md §10: a huge input costs a bounded amount).
``counts`` takes ``(query, doc)`` pairs too; a cross-encoder's pair inputs are
``sie.engines.onnx.pairs.PairInputs`` (a subclass).

``Sessions``: ``onnxruntime.InferenceSession``s of one graph, graph optimisation
``ORT_ENABLE_ALL``, ``CPUExecutionProvider`` (``CUDAExecutionProvider`` first when the
device is ``cuda[:n]`` and onnxruntime has it). On a CPU the cores are split among the
engine calls of this graph in flight, as the worker does for torch
(``sie.engines.runtime.threads``): each call's share is ``max(1, cores // calls)``
(on 2 cores two 1-thread MiniLM calls encoded 1.2-1.3x more sentences/s than one
2-thread call). A call spends its cores one of two ways
(docs/performance.md "Threads per session run"):

- a forward pass of at least ``parallel_min_tokens`` tokens (rows x sequence) runs on
  a session with the whole share as intra-op threads;
- smaller passes run on a 1-thread session, one after another in ``share`` groups:
  the first group on the calling thread, the others on the graph's pass pool
  (``cores`` threads at the engine calls' CPU priority). Each group holds one of the
  graph's ``cores`` core tokens while it runs, so no more groups run at once than there
  are cores, and a call that finds every core taken waits for the first group to end
  instead of for its call to go back through the event loop. With as many calls in
  flight as cores, each call's passes run on its own thread: a pass pool fed one pass
  at a time cost two hand-offs of the GIL per pass (the calling thread's and the pool
  thread's): about 4% of the served throughput at 32 x 1 (docs/performance.md "Passes on the
  calling thread"). A lone call still spreads its passes over every core. Intra-op
  threads cost more than they save on a small pass. Measured on 2 cores (MiniLM, one
  pass): float32 gains from a second thread only from about 24 tokens (1.3x at 37,
  1.4x at 226; 0.96x for one 10-token text); dynamically quantised int8 loses with it
  up to about 190 tokens (0.69x at 10 tokens, 0.85x at 75, 1.08x at 226).

A session per thread count, built on first use (1 and ``cores`` at load on a CPU);
each holds its own copy of the weights (``nbytes`` counts them all).

Intra-op threads do not spin while they wait for work
(``session.intra_op.allow_spinning = 0``): a spinning pool thread takes a core from the
call's own thread, the event loop and the other engine calls. On the shared 2-core
machine (load 5, the calling thread at nice 10 as the worker runs engine calls) a
2-thread MiniLM session encoded 9-11 sentences/s at batch 1 spinning and 131-137 not.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, cast

import numpy as np

from sie.core.errors import InferenceError, ModelLoadFailed
from sie.core.templates import render_input
from sie.engines.runtime.threads import cpu_cores, lower_priority
from sie.engines.truncation import apply_truncation

__all__ = [
    "FLOAT_PARALLEL_MIN_TOKENS",
    "INPUT_NAMES",
    "INT8_DISABLED_OPTIMIZERS",
    "INT8_PARALLEL_MIN_TOKENS",
    "Feeds",
    "Sessions",
    "TextInputs",
    "Texts",
    "import_onnx_stack",
]

log = logging.getLogger(__name__)

#: The inputs an encoder graph may take (int64 ``[batch, seq]``), in export order.
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")

#: Tokens (rows x sequence) from which a float32 forward pass runs on several intra-op
#: threads (module docstring: measured crossover about 24 on 2 cores).
FLOAT_PARALLEL_MIN_TOKENS = 24

#: The same for a dynamically quantised int8 graph (crossover about 190).
INT8_PARALLEL_MIN_TOKENS = 192

#: ONNX Runtime graph rewrites left off for a dynamically quantised int8 graph: the
#: fused ``SkipLayerNormalization`` kernel took about 43 us per call on a 20-token int8
#: pass where the Add and LayerNormalization it replaces take about 12 us together
#: (ORT's op profiler; docs/performance.md "Graph rewrites"). float32 keeps every one.
INT8_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)

#: What the tokenisation takes: single texts, or ``(query, doc)`` pairs.
Texts = Sequence[str] | Sequence[tuple[str, str]]

#: One forward pass's inputs: int64 ``[rows, seq]`` per input name.
Feeds = dict[str, np.ndarray]


def import_onnx_stack() -> tuple[Any, Any]:
    """``(onnxruntime, tokenizers.Tokenizer)``.

    Raises:
        ModelLoadFailed: (DEPENDENCY, permanent) either is not installed.
    """
    try:
        import onnxruntime
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ModelLoadFailed(
            f"cannot import the ONNX stack ({exc}); pip install 'sie[st,extract]'",
            error_class="DEPENDENCY",
            permanent=True,
        ) from exc
    return onnxruntime, Tokenizer


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class TextInputs:
    """Texts to model inputs for one tokenizer and window.

    Args:
        root: the weights directory (``tokenizer.json``, optional ``tokenizer_config.json``).
        window: most tokens per text, special tokens included (the torch pipeline's
            ``max_seq_length``).
        lowercase: lower-case texts first (sentence-transformers ``do_lower_case``).
        names: the graph's inputs (a subset of ``INPUT_NAMES``).

    Raises:
        ModelLoadFailed: NOT_FOUND (no ``tokenizer.json``) or UNKNOWN (unreadable).
    """

    def __init__(self, root: Path, window: int, lowercase: bool, names: Sequence[str]) -> None:
        _, tokenizer_cls = import_onnx_stack()
        path = root / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadFailed(
                f"no tokenizer.json in {str(root)!r} (the ONNX engines need a fast tokenizer)",
                error_class="NOT_FOUND",
                permanent=True,
            )
        try:
            counter, batcher, single = (
                tokenizer_cls.from_file(str(path)),
                tokenizer_cls.from_file(str(path)),
                tokenizer_cls.from_file(str(path)),
            )
        except Exception as exc:  # tokenizers raises its own Exception type
            raise ModelLoadFailed(
                f"cannot read {str(path)!r}: {exc}", error_class="UNKNOWN", permanent=True
            ) from exc
        counter.no_truncation()
        counter.no_padding()
        pad = batcher.padding or {}
        pad_token = pad.get("pad_token") or _read_json(root / "tokenizer_config.json").get(
            "pad_token"
        )
        if not isinstance(pad_token, str):
            pad_token = "[PAD]"
        pad_id = pad.get("pad_id")
        if pad_id is None:
            pad_id = batcher.token_to_id(pad_token) or 0
        batcher.enable_truncation(max_length=window)
        batcher.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to the batch's longest
        single.enable_truncation(max_length=window)
        single.no_padding()  # one text per forward pass: nothing to pad
        self.window = window
        self.lowercase = lowercase
        self.names = tuple(names)
        self._counter = counter
        self._batcher = batcher
        self._single = single
        #: per thread: the encodings of the texts ``counts`` saw last (for ``passes``)
        self._recent = threading.local()

    def _lowered(self, texts: Texts) -> list[Any]:
        """``texts`` as the tokenizer takes them (lower-cased when the pipeline says so)."""
        if not self.lowercase:
            return list(texts)
        return [t.lower() if isinstance(t, str) else (t[0].lower(), t[1].lower()) for t in texts]

    def features(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The graph's inputs for ``texts``: int64 ``[len(texts), longest]`` each."""
        encs = self._batcher.encode_batch(self._lowered(texts))
        fields = {
            "input_ids": [e.ids for e in encs],
            "attention_mask": [e.attention_mask for e in encs],
            "token_type_ids": [e.type_ids for e in encs],
        }
        return {n: np.asarray(fields[n], dtype=np.int64) for n in self.names}

    def passes(self, texts: Sequence[str], chunks: Sequence[Sequence[int]]) -> list[Feeds]:
        """The graph's inputs for each chunk of ``texts`` (indices): ``features`` of the
        chunk's texts. When every chunk is one text (int8: one text per forward pass) all
        texts are tokenised in one call, each unpadded: one trip out of and back into
        the GIL for the whole engine call instead of one per text; texts this thread's
        last ``counts`` tokenised are not tokenised again."""
        if not all(len(c) == 1 for c in chunks):
            return [self.features([texts[i] for i in chunk]) for chunk in chunks]
        ones = [texts[c[0]] for c in chunks]
        known: dict[str, Any] = getattr(self._recent, "encodings", None) or {}
        self._recent.encodings = None
        encs: list[Any] = [known.get(t) for t in ones]
        missing = [i for i, e in enumerate(encs) if e is None]
        if missing:
            fresh = self._single.encode_batch(self._lowered([ones[i] for i in missing]))
            for i, e in zip(missing, fresh, strict=True):
                encs[i] = e
        out: list[Feeds] = []
        for e in encs:
            fields = {
                "input_ids": e.ids,
                "attention_mask": e.attention_mask,
                "token_type_ids": e.type_ids,
            }
            out.append({n: np.asarray([fields[n]], dtype=np.int64) for n in self.names})
        return out

    def counts(self, texts: Texts) -> list[int]:
        """Each text's (or pair's) token count after truncation to the window (>= 1).

        Single texts are tokenised as ``passes`` tokenises them (truncated to the
        window, unpadded) and the encodings kept for the calling thread's next
        ``passes``: an engine call counts its texts in ``prepare`` and then encodes the
        same texts, so each is tokenised once, not twice."""
        if texts and all(isinstance(t, str) for t in texts):
            encs = self._single.encode_batch(self._lowered(texts))
            self._recent.encodings = dict(zip(cast(Sequence[str], texts), encs, strict=True))
            return [max(1, len(e.ids)) for e in encs]
        encs = self._counter.encode_batch(self._lowered(texts))
        return [max(1, min(self.window, len(e.ids))) for e in encs]

    def _clip(self, text: str) -> str:
        """A prefix of ``text`` that encodes exactly like it under truncation, else
        ``text`` (``DenseEncoder._clip``: the words wholly inside a cut tokenise as in
        the full text; once they fill the window the prefix is enough)."""
        n = self.window * 32
        while n < len(text):
            words = self._counter.encode(text[:n], add_special_tokens=False).word_ids
            last = words[-1] if words else None
            if sum(1 for w in words if w != last) >= self.window:
                return text[:n]
            n *= 4
        return text

    def prepare(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        is_query: bool,
        options: Mapping[str, Any],
        sie_id: str = "this model",
    ) -> tuple[list[str], list[int]]:
        """``EncodeEngine.prepare``: rendered (``sie.core.templates``), clipped texts
        (options ``truncate`` / ``max_input_tokens``: ``sie.engines.truncation``) and
        their token counts."""
        rendered = [render_input(t, instruction, is_query, options) for t in texts]
        clipped = [self._clip(t) for t in rendered]
        clipped = apply_truncation(
            self._counter, rendered, clipped, options, self.window, sie_id, lower=self.lowercase
        )
        return clipped, self.counts(clipped)


class Sessions:
    """Sessions of one ONNX graph, sized per call (module docstring).

    Args:
        path: the ``.onnx`` file.
        device: ``cpu`` or ``cuda[:n]``.
        max_threads: the cores to share (default: this process's, ``cpu_cores()``).
        parallel_min_tokens: the smallest forward pass (rows x sequence tokens) that
            runs on more than one intra-op thread (``FLOAT_PARALLEL_MIN_TOKENS``,
            ``INT8_PARALLEL_MIN_TOKENS``).
        disabled_optimizers: names of ONNX Runtime graph rewrites to leave off
            (``INT8_DISABLED_OPTIMIZERS``).

    Raises:
        ModelLoadFailed: (UNKNOWN, permanent) onnxruntime cannot load the graph.
    """

    def __init__(
        self,
        path: Path,
        device: str = "cpu",
        max_threads: int | None = None,
        parallel_min_tokens: int = FLOAT_PARALLEL_MIN_TOKENS,
        disabled_optimizers: Sequence[str] = (),
    ) -> None:
        self._ort, _ = import_onnx_stack()
        self.path = path
        self.device = device
        self.max_threads = max(1, max_threads or cpu_cores())
        self.parallel_min_tokens = max(1, parallel_min_tokens)
        self.disabled_optimizers = tuple(disabled_optimizers)
        self._providers = self._pick_providers(device)
        self._lock = threading.Lock()
        self._calls = 0
        self._by_threads: dict[int, Any] = {}
        self._passes: ThreadPoolExecutor | None = None
        #: one per core: held by each group of small passes while it runs
        self._cores = threading.Semaphore(self.max_threads)
        first = self._session(self.max_threads)
        if self._on_cpu:
            self._session(1)
        self.input_names = tuple(i.name for i in first.get_inputs())
        self.output_names = tuple(o.name for o in first.get_outputs())

    @property
    def _on_cpu(self) -> bool:
        return self._providers == ["CPUExecutionProvider"]

    def _pick_providers(self, device: str) -> list[Any]:
        if not device.startswith("cuda"):
            return ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" not in self._ort.get_available_providers():
            log.warning("onnxruntime has no CUDA provider here; %s runs on the CPU", self.path)
            return ["CPUExecutionProvider"]
        _, _, idx = device.partition(":")
        return [("CUDAExecutionProvider", {"device_id": int(idx or 0)}), "CPUExecutionProvider"]

    def _session(self, threads: int) -> Any:
        """The session with ``threads`` intra-op threads (built on first use)."""
        threads = threads if self._on_cpu else self.max_threads
        with self._lock:
            got = self._by_threads.get(threads)
        if got is not None:
            return got
        ort = self._ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(
                str(self.path),
                sess_options=opts,
                providers=self._providers,
                disabled_optimizers=list(self.disabled_optimizers),
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelLoadFailed(
                f"onnxruntime cannot load {str(self.path)!r}: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        with self._lock:
            return self._by_threads.setdefault(threads, session)

    @property
    def nbytes(self) -> int:
        """Bytes of weights the sessions hold (the graph's size on disk per session)."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return 0
        return size * max(1, len(self._by_threads))

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """The graph's first output for ``feeds`` (``run_all`` of one pass).

        Raises:
            InferenceError: onnxruntime failed.
        """
        return self.run_all([feeds])[0]

    def run_all(self, passes: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
        """The graph's first output for each forward pass's ``feeds`` (only the inputs
        the graph takes are passed), in order: one engine call. Passes of at least
        ``parallel_min_tokens`` tokens run one after another on the calling thread with
        the call's share of cores as intra-op threads. Smaller ones run on the
        1-thread session in up to ``share`` groups of consecutive passes, each group
        holding a core token while it runs: the first on the calling thread, the
        others on the graph's pass pool (module docstring). The call ends only when
        all of its passes have.

        Raises:
            InferenceError: onnxruntime failed.
        """
        with self._lock:
            self._calls += 1
            share = max(1, self.max_threads // self._calls) if self._on_cpu else 1
        try:
            out: list[Any] = [None] * len(passes)
            small: list[int] = []
            for i, feeds in enumerate(passes):
                if feeds["input_ids"].size >= self.parallel_min_tokens:
                    out[i] = self._run(self._session(share), feeds)
                else:
                    small.append(i)
            if small:
                self._run_small(passes, small, share, out)
            return out  # every pass has run: an error above left the call
        except ModelLoadFailed as exc:
            raise InferenceError(f"encode failed: {exc.message}") from exc
        except InferenceError:
            raise
        except Exception as exc:
            raise InferenceError(f"encode failed: {type(exc).__name__}: {exc}") from exc
        finally:
            with self._lock:
                self._calls -= 1

    def _run_small(
        self,
        passes: Sequence[Mapping[str, np.ndarray]],
        small: Sequence[int],
        share: int,
        out: list[Any],
    ) -> None:
        """Run the passes ``small`` (indices into ``passes``) on the 1-thread session
        into ``out``: in ``min(share, len(small))`` groups of consecutive passes, each
        holding a core token on a CPU (the first group on this thread)."""
        single = self._session(1)
        if not self._on_cpu or self.max_threads == 1:
            for i in small:  # nothing to spread: no thread hand-off
                out[i] = self._run(single, passes[i])
            return
        n = min(share, len(small))
        size, extra = divmod(len(small), n)
        groups, start = [], 0
        for g in range(n):
            end = start + size + (g < extra)
            groups.append(small[start:end])
            start = end
        pool = self._pass_pool() if n > 1 else None
        futures = (
            [pool.submit(self._run_group, single, passes, g) for g in groups[1:]] if pool else []
        )
        try:
            mine = self._run_group(single, passes, groups[0])
        finally:
            wait(futures)  # the call ends only when its passes have
        for group, got in zip(groups, [mine, *(f.result() for f in futures)], strict=True):
            for i, o in zip(group, got, strict=True):
                out[i] = o

    def _run_group(
        self, session: Any, passes: Sequence[Mapping[str, np.ndarray]], group: Sequence[int]
    ) -> list[np.ndarray]:
        """The passes ``group`` one after another, holding one core token throughout."""
        with self._cores:
            return [self._run(session, passes[i]) for i in group]

    def _run(self, session: Any, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        inputs = {n: feeds[n] for n in self.input_names}
        return np.asarray(session.run(self.output_names[:1], inputs)[0])

    def _pass_pool(self) -> ThreadPoolExecutor:
        """The threads that run the groups of small passes a call does not run itself
        (``max_threads``, made on first use, at the engine calls' CPU priority)."""
        with self._lock:
            if self._passes is None:
                self._passes = ThreadPoolExecutor(
                    self.max_threads,
                    thread_name_prefix="sie-onnx-pass",
                    initializer=lower_priority,
                )
            return self._passes

    def close(self) -> None:
        """Stop the pass pool's threads (the sessions go with the object)."""
        if self._passes is not None:
            self._passes.shutdown(wait=False)
            self._passes = None
