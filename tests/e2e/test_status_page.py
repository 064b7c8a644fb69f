"""The operator's status page in a real browser (docs/api.md §13; architecture §14).

config, one gateway and workers run as ``sie serve`` processes on a real nats-server
with auth on; Debian's headless chromium, driven by selenium through Debian's
chromedriver (``make browser`` installs both; nothing is downloaded), opens
``/?token=…`` and the test asserts what a person sees, without reloading: one worker,
then a second one (another machine profile) joining, a pool created with
``POST /v1/pools`` with its lease, the second worker killed and shown lost, and the page
reconnecting after the gateway restarts.

``SIE_UPDATE_SCREENSHOT=1`` writes ``docs/status-page.png`` (two workers and a pool).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import BUNDLES, CONFIGS, MINILM, ROOT, wait_for
from tests.e2e.test_nats_topology import Topology
from tests.natsserver import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

USER, ADMIN = "status-user-token", "status-admin-token"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1000",
)
SCREENSHOT = ROOT / "docs" / "status-page.png"
WAIT_S = 60


def browser_binaries() -> tuple[str, str]:
    """Debian's chromium and chromedriver; a failure (not a skip) when missing: the
    project's set-up installs them (``make browser``, a step of ``make test``)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail("chromium and chromedriver are missing: run `make browser` (apt-get, as root)")
    return chromium, driver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    chromium, driver_path = browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


class StatusTopology(Topology):
    """config, one gateway and worker ``w1`` (machine profile ``default``), auth on."""

    def start(self) -> None:
        self.nats.start()
        self.spawn(
            "config",
            "--roles=config",
            "--config-port",
            str(self.cfg_port),
            "--models-dir",
            str(CONFIGS),
            "--bundles-dir",
            str(BUNDLES),
        )
        self.spawn("gateway", "--roles=gateway", "--port", str(self.gw_ports[0]), **self.config_env)
        self.spawn_worker("w1", "default")
        self.wait_ready(1)

    def spawn_worker(self, worker_id: str, machine_profile: str) -> None:
        self.spawn(
            worker_id,
            "--roles=worker",
            "--preload",
            MINILM,
            SIE_WORKER_ID=worker_id,
            SIE_MACHINE_PROFILE=machine_profile,
            SIE_METRICS_PORT=str(free_port()),  # each worker's own /metrics
            **self.config_env,
        )

    @property
    def config_env(self) -> dict[str, str]:
        """Gateways and workers bootstrap from the config role (architecture §4)."""
        return {"SIE_CONFIG_SERVICE_URL": f"http://127.0.0.1:{self.cfg_port}"}

    def wait_ready(self, workers: int = 1) -> None:
        """Until the gateway's status shows ``workers`` ready workers."""
        base = self.bases[0]

        def ready() -> bool:
            for name, p in self.procs.items():
                assert p.poll() is None, f"{name} exited\n" + self.logs()
            try:
                state = httpx.get(f"{base}/v1/cluster/status", headers=AUTH, timeout=1).json()
            except (httpx.HTTPError, ValueError):
                return False
            return sum(1 for w in state["workers"] if w["healthy"]) == workers

        try:
            wait_for(ready, timeout_s=180)
        except AssertionError:
            pytest.fail("the topology did not become ready\n" + self.logs())

    @property
    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{self.gw_ports[0]}"]


AUTH = {"Authorization": f"Bearer {USER}"}


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[StatusTopology]:
    env = {
        "SIE_AUTH_MODE": "token",
        "SIE_AUTH_TOKEN": USER,
        "SIE_ADMIN_TOKEN": ADMIN,
        "SIE_HEARTBEAT_INTERVAL_S": "0.5",
        "SIE_DRAIN_TIMEOUT_S": "10",
    }
    t = StatusTopology(tmp_path, env=env)
    try:
        t.start()
        yield t
    finally:
        t.stop()


def rows(driver: Any, selector: str) -> list[Any]:
    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def until(driver: Any, what: str, pred: Any) -> Any:
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(
        lambda d: pred(d), f"the page never showed {what}"
    )


def text_of(driver: Any, selector: str) -> str:
    found = rows(driver, selector)
    return str(found[0].text) if found else ""


@pytest.mark.timeout(300)
def test_status_page_follows_the_cluster(
    topology: StatusTopology, browser: webdriver.Chrome
) -> None:
    base = topology.bases[0]
    assert httpx.get(f"{base}/").status_code == 401  # the page needs the token too
    browser.get(f"{base}/?token={USER}")
    browser.execute_script("window.__sieNoReload = true")

    # one worker, ready, with MiniLM loaded; the stream is live
    until(browser, "w1 ready", lambda d: rows(d, '[data-worker-id="w1"][data-status="ready"]'))
    until(browser, "the live indicator", lambda d: rows(d, '#connection[data-state="live"]'))
    assert len(rows(browser, "#workers [data-worker-id]")) == 1
    assert MINILM in text_of(browser, '[data-worker-id="w1"] [data-field="loaded_models"]')
    until(
        browser,
        "MiniLM loaded",
        lambda d: rows(d, f'[data-model-id="{MINILM}"][data-state="loaded"]'),
    )
    assert rows(browser, '[data-pool="default"][data-state="active"]')
    assert rows(browser, '[data-lane="default/default/default"]')

    # a second worker on another machine profile joins: it appears without a reload
    topology.spawn_worker("w2", "l4")
    until(browser, "w2 ready", lambda d: rows(d, '[data-worker-id="w2"][data-status="ready"]'))
    assert text_of(browser, '[data-worker-id="w2"] [data-field="machine_profile"]') == "l4"
    until(browser, "the l4 lane", lambda d: rows(d, '[data-lane="default/l4/default"]'))

    # a pool with a lease: its floor, assigned worker and expiry
    spec = {"name": "eval", "gpus": {"l4": 1}, "ttl_seconds": 900, "minimum_worker_count": 1}
    r = httpx.post(
        f"{base}/v1/pools", json=spec, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert r.status_code == 201, r.text
    until(browser, "the eval pool", lambda d: rows(d, '[data-pool="eval"][data-state="active"]'))
    assert "w2" in text_of(browser, '[data-pool="eval"] [data-field="assigned_workers"]')
    expires = text_of(browser, '[data-pool="eval"] [data-expires-at]')
    assert expires.startswith("in 1") and "min" in expires, expires  # ~15 min
    assert browser.execute_script("return window.__sieNoReload") is True
    if os.environ.get("SIE_UPDATE_SCREENSHOT") == "1":
        height = browser.execute_script("return document.documentElement.scrollHeight")
        metrics = {"width": 1440, "height": int(height), "deviceScaleFactor": 1, "mobile": False}
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        browser.save_screenshot(str(SCREENSHOT))
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    # the second worker is killed: the page shows it lost (or drops it)
    topology.procs["w2"].send_signal(signal.SIGKILL)
    topology.procs["w2"].wait(timeout=10)
    until(
        browser,
        "w2 lost",
        lambda d: (
            rows(d, '[data-worker-id="w2"][data-status="lost"]')
            or not rows(d, '[data-worker-id="w2"]')
        ),
    )
    assert rows(browser, '[data-worker-id="w1"][data-status="ready"]')

    # the gateway restarts: the stream closes, the page says so, then reconnects
    gateway = topology.procs["gateway"]
    gateway.send_signal(signal.SIGTERM)
    until(browser, "the stream down", lambda d: rows(d, '#connection[data-state="down"]'))
    gateway.wait(timeout=20)
    topology.respawn("gateway")
    until(browser, "the stream live again", lambda d: rows(d, '#connection[data-state="live"]'))
    until(
        browser,
        "w1 after the restart",
        lambda d: rows(d, '[data-worker-id="w1"][data-status="ready"]'),
    )
    assert browser.execute_script("return window.__sieNoReload") is True
