"""Gateway/worker config convergence, branch by branch (architecture §4.1-§4.3).

The authority is the real config app on an ASGI transport (no sockets needed).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from sie.control.authority import ConfigAuthority
from sie.control.store import ConfigStore
from sie.control.sync import BootstrapError, ConfigSync, producer_trusted
from sie.core.config import parse_model_config
from sie.core.epoch import ConfigEpoch
from sie.core.registry import ModelRegistry
from sie.core.wire import ConfigNotification
from sie.http.config import build_config_app
from sie.roles.config import ConfigRole
from sie.settings import ServeSettings
from sie.telemetry import Metrics
from tests.configdata import DEFAULT_BUNDLE, OTHER_BUNDLE, model_doc, model_yaml, registry

pytestmark = pytest.mark.anyio


class Authority:
    """A real config app behind an ASGI transport; ``fail`` makes it answer 503."""

    def __init__(self, bundles: Any = (DEFAULT_BUNDLE,)) -> None:
        role = ConfigRole.__new__(ConfigRole)
        role.authority = ConfigAuthority(
            registry(*bundles), store=ConfigStore(f"memory://sync-{uuid.uuid4().hex}")
        )
        self.role = role
        self.app = build_config_app(role, Metrics())
        self.fail: set[str] = set()
        self.calls: list[str] = []

    @property
    def authority(self) -> ConfigAuthority:
        return self.role.authority

    def transport(self, export: dict[str, Any] | None = None) -> httpx.AsyncBaseTransport:
        """The app, recording calls; ``fail`` paths answer 503; ``export`` overrides the export."""
        inner = httpx.ASGITransport(app=self.app)
        outer = self

        class T(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                outer.calls.append(request.url.path)
                if any(request.url.path.startswith(p) for p in outer.fail):
                    return httpx.Response(503, text="down")
                if export is not None and request.url.path == "/v1/configs/export":
                    return httpx.Response(200, json=export)
                return await inner.handle_async_request(request)

        return T()

    def sync(self, reg: ModelRegistry | None = None, **kw: Any) -> ConfigSync:
        reg = reg or ModelRegistry()
        return ConfigSync(
            reg, ConfigEpoch(), base_url="http://config", transport=self.transport(), **kw
        )


async def test_bootstrap_fetches_epoch_then_bundles_then_export() -> None:
    auth = Authority((DEFAULT_BUNDLE, OTHER_BUNDLE))
    await auth.authority.write(model_yaml("org/a"))
    await auth.authority.write(model_yaml("org/b"))
    s = auth.sync()
    out = await s.bootstrap_once()
    assert auth.calls == [
        "/v1/configs/epoch",
        "/v1/configs/bundles",
        "/v1/configs/bundles/default",
        "/v1/configs/bundles/other",
        "/v1/configs/export",
    ]
    assert out.epoch == 2 and s.epoch.get() == 2 and out.applied == 2 and out.failed == 0
    snap = s.registry.snapshot
    assert sorted(snap.configs) == ["org/a", "org/b"] and sorted(snap.bundles) == [
        "default",
        "other",
    ]
    info = auth.authority.epoch_info()
    assert s.bundles_hash == info["bundles_hash"] == snap.bundles_hash()
    # hash parity (architecture §7): the gateway's view hashes exactly like the authority's
    assert (
        s.bundle_config_hashes_hash
        == info["bundle_config_hashes_hash"]
        == snap.bundle_config_hashes_hash()
    )
    assert s.bootstrapped and not s.degraded


async def test_bootstrap_export_replaces_seed_models_including_removals() -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    seeded = registry()
    seeded.add_model_config(parse_model_config(model_doc("org/only-local")))
    s = auth.sync(seeded)
    await s.bootstrap_once()
    assert sorted(s.registry.snapshot.configs) == ["org/a"]


@pytest.mark.parametrize("path", ["/v1/configs/epoch", "/v1/configs/bundles", "/v1/configs/export"])
async def test_any_failed_step_advances_nothing(path: str) -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    s = auth.sync()
    auth.fail = {path}
    with pytest.raises(BootstrapError):
        await s.bootstrap_once()
    assert s.epoch.get() == 0 and s.bundles_hash == "" and not s.registry.snapshot.configs


async def test_partial_apply_changes_no_model_and_advances_nothing() -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    s = auth.sync()
    export = await auth.authority.export()
    export["models"].append({"model_id": "bad", "model_config": {"sie_id": "bad"}})

    s.transport = auth.transport(export=export)
    with pytest.raises(BootstrapError, match="1 of 2"):
        await s.bootstrap_once()
    assert s.epoch.get() == 0 and not s.registry.snapshot.configs and s.bundles_hash == ""
    assert not s.registry.snapshot.bundles  # bundles too: all or nothing (§4.1)


async def test_rows_without_a_body_are_skipped_not_failed() -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    s = auth.sync()
    export = await auth.authority.export()
    export["models"].append({"model_id": "empty", "model_config": None, "raw_yaml": None})

    s.transport = auth.transport(export=export)
    out = await s.bootstrap_once()
    assert out.total == 1 and out.applied == 1


async def test_bootstrap_retries_with_backoff_and_degrades_then_recovers() -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    metrics = Metrics()
    s = auth.sync(backoff_initial_s=0.001, backoff_max_s=0.004, metrics=metrics)
    auth.fail = {"/v1/configs/epoch"}
    import anyio

    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run_bootstrap)
        with anyio.fail_after(5):
            while s.failures < 10:  # noqa: ASYNC110 - polling a plain counter
                await anyio.sleep(0.001)
        assert s.degraded
        assert (
            metrics.registry.get_sample_value(
                "sie_gateway_config_bootstrap_degraded", {"role": "gateway"}
            )
            == 1
        )
        auth.fail = set()
    assert s.bootstrapped and not s.degraded and s.failures == 0 and s.epoch.get() == 1
    assert (
        metrics.registry.get_sample_value(
            "sie_gateway_config_bootstrap_degraded", {"role": "gateway"}
        )
        == 0
    )


async def test_no_url_is_a_no_op() -> None:
    s = ConfigSync(ModelRegistry(), ConfigEpoch(), base_url=None)
    await s.run()  # returns at once
    with pytest.raises(BootstrapError):
        await s.bootstrap_once()


# -- poller (§4.2) ---------------------------------------------------------------------------


async def test_poll_in_sync_does_nothing() -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    s = auth.sync()
    await s.bootstrap_once()
    auth.calls.clear()
    assert await s.poll_once() == "in_sync" and auth.calls == ["/v1/configs/epoch"]


async def test_poll_remote_ahead_resyncs_even_from_zero() -> None:
    auth = Authority()
    s = auth.sync()
    await s.bootstrap_once()
    await auth.authority.write(model_yaml("org/a"))  # a delta the gateway never saw
    assert await s.poll_once() == "resynced"
    assert s.epoch.get() == 1 and "org/a" in s.registry.snapshot.configs


async def test_poll_bundle_hash_drift_resyncs() -> None:
    auth = Authority()
    s = auth.sync()
    await s.bootstrap_once()
    assert auth.authority.registry is not None
    auth.authority.registry.install_bundles([DEFAULT_BUNDLE, OTHER_BUNDLE])  # a redeploy
    assert await s.poll_once() == "resynced"
    assert sorted(s.registry.snapshot.bundles) == ["default", "other"]


async def test_poll_empty_remote_hash_is_skipped() -> None:
    auth = Authority()
    s = auth.sync()
    await s.bootstrap_once()
    s.bundles_hash = "stale"
    s.bundle_config_hashes_hash = "stale"

    class T(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return httpx.Response(
                200, json={"epoch": 0, "bundles_hash": "", "bundle_config_hashes_hash": ""}
            )

    s.transport = T()
    assert await s.poll_once() == "in_sync"


async def test_poll_remote_behind_reexports_then_force_sets() -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    s = auth.sync()
    await s.bootstrap_once()
    s.epoch.set_max(7)  # e.g. a forged delta pushed us ahead, or the authority lost its epoch
    auth.fail = {"/v1/configs/export"}
    assert await s.poll_once() == "resync_failed"
    assert s.epoch.get() == 7  # a failed recovery keeps local > remote: retried next tick
    auth.fail = set()
    assert await s.poll_once() == "recovered"
    assert s.epoch.get() == 1


async def test_poll_failure_is_swallowed_and_resets_nothing() -> None:
    auth = Authority()
    await auth.authority.write(model_yaml("org/a"))
    s = auth.sync()
    await s.bootstrap_once()
    before = (s.epoch.get(), s.bundles_hash, s.bundle_config_hashes_hash)
    auth.fail = {"/v1/configs/epoch"}
    assert await s.poll_once() == "error"
    assert (s.epoch.get(), s.bundles_hash, s.bundle_config_hashes_hash) == before


# -- live deltas (§4.3) ----------------------------------------------------------------------


def note(**kw: Any) -> bytes:
    base: dict[str, Any] = {
        "router_id": "sie-config-5f7b6d8c-kxwvr",
        "bundle_id": "default",
        "epoch": 3,
        "model_id": "org/a",
        "model_config_yaml": model_yaml("org/a").decode(),
    }
    base.update(kw)
    return ConfigNotification(**base).to_bytes()


def delta_sync(**kw: Any) -> ConfigSync:
    return ConfigSync(registry(), ConfigEpoch(), base_url=None, **kw)


def test_producer_allowlist_matches_exact_or_pod_name() -> None:
    allow = ["sie-config"]
    assert producer_trusted("sie-config", allow)
    assert producer_trusted("sie-config-5f7b6d8c-kxwvr", allow)
    assert producer_trusted("sie-config-0", allow)
    assert not producer_trusted("sie-configuration", allow)
    assert not producer_trusted("evil", allow)
    assert producer_trusted("anyone", [])


def test_delta_applies_and_advances_epoch() -> None:
    s = delta_sync()
    assert s.handle_delta(note()) == "applied"
    assert s.epoch.get() == 3 and "org/a" in s.registry.snapshot.configs


def test_untrusted_delta_changes_nothing_unless_trust_any() -> None:
    s = delta_sync()
    assert s.handle_delta(note(router_id="sie-configuration")) == "untrusted"
    assert s.epoch.get() == 0 and not s.registry.snapshot.configs
    s2 = delta_sync(trust_any_producer=True)
    assert s2.handle_delta(note(router_id="whoever")) == "applied"


def test_custom_allowlist() -> None:
    s = delta_sync(trusted_producers=("my-config",))
    assert s.handle_delta(note()) == "untrusted"
    assert s.handle_delta(note(router_id="my-config-0")) == "applied"


def test_blank_body_is_a_pure_epoch_bump() -> None:
    s = delta_sync()
    assert s.handle_delta(note(model_config_yaml="  \n")) == "epoch_bump"
    assert s.epoch.get() == 3 and not s.registry.snapshot.configs


def test_bad_payloads_advance_nothing() -> None:
    s = delta_sync()
    assert s.handle_delta(b"not json") == "bad_payload"
    assert s.handle_delta(b'{"bundle_id": "x"}') == "bad_payload"
    assert s.handle_delta(note(model_config_yaml="sie_id: [")) == "bad_yaml"
    assert s.handle_delta(note(model_config_yaml="sie_id: x\n")) == "bad_yaml"
    assert s.epoch.get() == 0


def test_registry_rejection_advances_nothing() -> None:
    s = delta_sync()
    assert s.handle_delta(note()) == "applied"
    changed = model_doc("org/a")
    changed["profiles"]["default"]["max_batch_tokens"] = 5
    from sie.core.config import dump_yaml

    assert s.handle_delta(note(epoch=9, model_config_yaml=dump_yaml(changed))) == "rejected"
    unroutable = model_doc(
        "org/b", profiles={"default": {"adapter_path": "x.y:Z", "max_batch_tokens": 1}}
    )
    assert s.handle_delta(note(epoch=9, model_config_yaml=dump_yaml(unroutable))) == "rejected"
    assert s.epoch.get() == 3


def test_late_lower_epoch_never_rolls_back() -> None:
    s = delta_sync()
    s.handle_delta(note(epoch=5))
    assert s.handle_delta(note(epoch=2, model_config_yaml="")) == "epoch_bump"
    assert s.epoch.get() == 5


def test_unknown_fields_and_producer_id_alias_are_accepted() -> None:
    s = delta_sync()
    import json

    payload = json.loads(note())
    payload["producer_id"] = payload.pop("router_id")
    payload["from_the_future"] = {"x": 1}
    assert s.handle_delta(json.dumps(payload).encode()) == "applied"


def test_settings_reach_the_sync() -> None:
    st = ServeSettings(config_trusted_producers="a,b", config_poll_interval_s=2)  # type: ignore[arg-type]
    assert st.config_trusted_producers == ("a", "b") and st.config_poll_interval_s == 2


async def test_degraded_after_five_minutes_of_failure_even_below_ten_attempts() -> None:
    import time

    auth = Authority()
    s = auth.sync()
    auth.fail = {"/v1/configs/epoch"}
    with pytest.raises(BootstrapError):
        await s.bootstrap_once()
    s._record_failure(BootstrapError("x"))
    assert s.failures == 1 and not s.degraded
    s._first_failure = time.monotonic() - 301  # sustained failure for over 5 minutes
    s._record_failure(BootstrapError("x"))
    assert s.failures == 2 and s.degraded


async def test_poller_skips_its_first_tick() -> None:
    import anyio

    auth = Authority()
    s = auth.sync(poll_interval_s=0.3)
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.run_poller)
        await anyio.sleep(0.15)
        assert auth.calls == []  # no poll at start: the bootstrap attempt goes first
        await anyio.sleep(0.3)
        assert auth.calls and auth.calls[0] == "/v1/configs/epoch"
        tg.cancel_scope.cancel()


async def test_after_an_applied_delta_the_poll_is_in_sync_without_reexport() -> None:
    auth = Authority()
    s = auth.sync()
    await s.bootstrap_once()
    from sie.transport.memory import MemoryBus

    async with MemoryBus() as bus:
        auth.authority.publisher = bus
        auth.authority.producer_id = "sie-config-0"
        sub = await bus.subscribe("sie.config.models._all")
        await auth.authority.write(model_yaml("org/new"))
        assert s.handle_delta((await sub.next_msg(1)).data) == "applied"
    auth.calls.clear()
    assert await s.poll_once() == "in_sync"
    assert auth.calls == ["/v1/configs/epoch"]  # no bundles/export round-trip
