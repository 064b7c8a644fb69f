"""Acceptance: config writes become servable without a restart, and hash parity
(architecture §3, §4.3, §6, §7).

One all-in-one stack (gateway, config, worker; MiniLM on the CPU), each role with
its own registry converging over the bus and the config service.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import numpy as np
import pytest

from sie.container import build_worker_role
from sie.core.config import parse_model_config
from sie.core.errors import SieError
from sie.core.hashing import bundle_document
from sie.core.registry import ModelRegistry
from sie.settings import ServeSettings
from sie.transport.memory import MemoryBus
from tests.conftest import MINILM, Stack, post_until_ok, run_stack, wait_for

pytestmark = pytest.mark.slow

NEW = "acme/minilm-raw"
NEW_YAML = f"""sie_id: {NEW}
hf_id: sentence-transformers/all-MiniLM-L6-v2
tasks: {{encode: {{dense: {{dim: 384}}}}}}
max_sequence_length: 256
profiles:
  default:
    adapter_path: sie.engines.encoders.sentence_transformers:DenseEncoder
    max_batch_tokens: 8192
    adapter_options:
      loadtime: {{flag: 0}}
      runtime: {{normalize: false, prefix_note: "質問 ✓"}}
""".encode()


@pytest.fixture(scope="module")
def flow() -> Iterator[Stack]:
    with run_stack(config_poll_interval_s=0.5, preload=(MINILM,)) as s:
        yield s


def cfg(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.running.config_port}"


def test_posted_model_is_served_and_acked_without_restart(flow: Stack, st_model: Any) -> None:
    w = httpx.post(f"{cfg(flow)}/v1/configs/models", content=NEW_YAML)
    assert w.status_code == 201, w.text
    write_epoch = w.json()["epoch"]
    gw = flow.base_url
    text = ["served by a config written at runtime"]
    r = post_until_ok(f"{gw}/v1/encode/{NEW}", {"items": [{"text": text[0]}]})
    vec = np.array(r.json()["items"][0]["dense"]["values"], dtype=np.float32)
    assert vec.shape == (384,)
    # the runtime options reach the engine (MiniLM's own pipeline still normalises)
    raw = st_model.encode(text, normalize_embeddings=False)[0]
    np.testing.assert_allclose(vec, raw, atol=1e-4)
    status = wait_for(
        lambda: (
            s
            if (s := httpx.get(f"{gw}/v1/configs/models/{NEW}/status").json())["all_bundles_acked"]
            else None
        )
    )
    worker = flow.running.worker
    assert worker is not None
    assert status["no_bundles"] is False and status["config_epoch"] >= write_epoch
    (row,) = status["bundles"]
    assert row["bundle_id"] == "default" and row["pool"] == "default"
    assert row["acked_workers"] == [worker.worker_id] and row["pending_workers"] == []
    assert row["total_eligible_workers"] == 1 and row["acked"] is True


def test_appended_profile_is_served(flow: Stack) -> None:
    worker = flow.running.worker
    assert worker is not None
    assert (
        httpx.post(
            f"{flow.base_url}/v1/encode/{MINILM}", json={"items": [{"text": "a"}]}
        ).status_code
        == 200
    )
    base_slot = worker.models._slots[MINILM]
    body = (
        f"sie_id: {MINILM}\nprofiles:\n  short:\n    extends: default\n    max_batch_tokens: 512\n"
    )
    w = httpx.post(f"{cfg(flow)}/v1/configs/models", content=body)
    assert w.status_code == 201 and w.json()["created_profiles"] == ["short"]
    r = post_until_ok(
        f"{flow.base_url}/v1/encode/{MINILM}:short",
        json={"items": [{"text": "hi"}]},
    )
    assert len(r.json()["items"][0]["dense"]["values"]) == 384
    # appending a profile does not reload the base model (its load key is unchanged)
    assert (
        httpx.post(
            f"{flow.base_url}/v1/encode/{MINILM}", json={"items": [{"text": "a"}]}
        ).status_code
        == 200
    )
    assert worker.models._slots[MINILM] is base_slot


def test_hash_parity_config_gateway_worker(flow: Stack) -> None:
    """architecture §7: config role, gateway and worker hash byte-identically, including
    ``adapter_options`` like ``{"flag": 0}`` and non-ASCII option values."""
    httpx.post(f"{cfg(flow)}/v1/configs/models", content=NEW_YAML)
    run = flow.running
    assert run.config is not None and run.gateway is not None and run.worker is not None
    config_reg, gw_reg, wk_reg = run.config.registry, run.gateway.registry, run.worker.registry
    assert config_reg is not None

    def hashes() -> tuple[str, str, str]:
        return (
            config_reg.snapshot.bundle_config_hash("default", "default"),
            gw_reg.snapshot.bundle_config_hash("default", "default"),
            run.worker.heartbeat().bundle_config_hash,
        )

    h = wait_for(lambda: x if len(set(x := hashes())) == 1 else None)
    assert len(h[0]) == 64
    # whole-fingerprint parity, as the poller compares it
    epoch = httpx.get(f"{cfg(flow)}/v1/configs/epoch").json()
    assert epoch["bundle_config_hashes_hash"] == gw_reg.snapshot.bundle_config_hashes_hash()
    assert epoch["bundles_hash"] == gw_reg.snapshot.bundles_hash() == wk_reg.snapshot.bundles_hash()
    # the canonical document is raw UTF-8 JSON (not ASCII-escaped); {loadtime: {flag: 0}}
    # is a truthy value of adapter_options, so it is kept (§7's predicate is per value)
    doc = bundle_document([parse_model_config(NEW_YAML)], gw_reg.snapshot.bundles["default"])
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert "質問 ✓" in text and '"loadtime":{"flag":0}' in text


def test_worker_with_stale_hash_is_pending(flow: Stack) -> None:
    gw = flow.running.gateway
    assert gw is not None
    from sie.core.wire import Heartbeat

    fake = Heartbeat(
        worker_id="zz-stale",
        pool="default",
        machine_profile="default",
        bundle="default",
        ready=True,
        bundle_config_hash="old",
    )
    other_case = Heartbeat(
        worker_id="zz-case",
        pool="default",
        machine_profile="default",
        bundle="Default",
        ready=True,
        bundle_config_hash="old",
    )
    from sie.core.subjects import health_subject

    for hb in (fake, other_case):
        flow.portal.call(gw.bus.publish, health_subject(hb.worker_id), hb.to_bytes())
    status = wait_for(
        lambda: (
            s
            if "zz-stale"
            in (s := httpx.get(f"{flow.base_url}/v1/configs/models/{MINILM}/status").json())[
                "bundles"
            ][0]["pending_workers"]
            else None
        )
    )
    row = status["bundles"][0]
    assert row["acked"] is False and status["all_bundles_acked"] is False
    assert "zz-case" not in row["pending_workers"] + row["acked_workers"]  # exact bundle match only


def test_worker_behind_the_gateway_retries_instead_of_404(flow: Stack) -> None:
    """The gateway knows a model the worker has not heard of (a delta lost on the worker's
    side): the worker NAKs, resyncs from the config role, then serves it (§4.2)."""
    run = flow.running
    assert run.config is not None and run.worker is not None and run.gateway is not None
    run.worker.sync.poll_interval_s = 3600.0  # the worker's own poller will not help...
    time.sleep(2 * flow.settings.config_poll_interval_s)  # ...once its current sleep ends
    publisher = run.config.authority.publisher
    run.config.authority.publisher = None  # no deltas: only pollers can learn of the write
    try:
        w = httpx.post(
            f"{cfg(flow)}/v1/configs/models", content=NEW_YAML.replace(NEW.encode(), b"acme/lagged")
        )
        assert w.status_code == 201, w.text
        wait_for(lambda: "acme/lagged" in run.gateway.registry.snapshot.configs)
        assert "acme/lagged" not in run.worker.registry.snapshot.configs
        r = httpx.post(
            f"{flow.base_url}/v1/encode/acme/lagged", json={"items": [{"text": "x"}]}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert "acme/lagged" in run.worker.registry.snapshot.configs
    finally:
        run.config.authority.publisher = publisher


def _seedless_worker(cfg_url: str | None, bundle: str) -> Any:
    settings = ServeSettings(
        roles=("worker",), bundle=bundle, worker_id=f"seedless-{time.monotonic_ns()}"
    )
    return MemoryBus(), lambda bus: build_worker_role(
        bus, ModelRegistry(), settings, config_service_url=cfg_url
    )


@pytest.mark.anyio
async def test_worker_without_a_seed_loads_its_bundle_from_the_config_service(
    flow: Stack,
) -> None:
    # architecture §4: a worker process started with no --models-dir/--bundles-dir
    bus, make = _seedless_worker(f"http://127.0.0.1:{flow.running.config_port}", "default")
    async with bus, anyio.create_task_group() as tg:
        worker = make(bus)
        await tg.start(worker.run)
        for _ in range(600):
            if worker.ready:
                break
            await anyio.sleep(0.05)
        assert "default" in worker.registry.snapshot.bundles
        assert MINILM in worker.registry.snapshot.entries
        assert worker.heartbeat().bundle_config_hash == (
            flow.running.config.registry.snapshot.bundle_config_hash("default", "default")
        )
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_worker_for_a_bundle_the_config_service_lacks_fails_clearly(flow: Stack) -> None:
    bus, make = _seedless_worker(f"http://127.0.0.1:{flow.running.config_port}", "nope")
    with pytest.raises(BaseException) as info:
        async with bus, anyio.create_task_group() as tg:
            with anyio.fail_after(30):
                await tg.start(make(bus).run)
                await anyio.sleep_forever()
    leaf = info.value
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, SieError) and "'nope' is unknown to the config service" in str(
        leaf.message
    )


def test_worker_without_a_seed_or_config_service_refuses_to_start() -> None:
    bus, make = _seedless_worker(None, "default")

    async def go() -> None:
        async with bus:
            await make(bus).run()

    with pytest.raises(SieError, match="SIE_CONFIG_SERVICE_URL"):
        anyio.run(go)
