"""The ``/docs`` page in Debian's headless chromium (docs/api.md §14): under its own
Content-Security-Policy it fetches ``/openapi.json`` with the ``?token=`` it was opened
with and lists every operation of the gateway and of the config role."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import Stack, run_stack
from tests.e2e.test_status_page import browser  # noqa: F401  (the chromium fixture)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

USER, ADMIN = "docs-page-user", "docs-page-admin"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(
        roles=("gateway", "config"), auth_mode="token", auth_token=USER, admin_token=ADMIN
    ) as s:
        yield s


@pytest.mark.parametrize("app", ["gateway", "config"])
def test_docs_page_lists_every_operation(
    stack: Stack,
    browser: webdriver.Chrome,  # noqa: F811
    app: str,
) -> None:
    url = stack.base_url if app == "gateway" else f"http://127.0.0.1:{stack.running.config_port}"
    doc = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {USER}"}).json()
    count = sum(len(item) for item in doc["paths"].values()) + len(doc.get("x-websockets", {}))
    browser.get(f"{url}/docs?token={USER}")
    WebDriverWait(browser, 30).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "details.op")) == count
    )
    assert browser.find_element(By.ID, "title").text == doc["info"]["title"]
    assert browser.find_element(By.ID, "error").text == ""
    schemas = browser.find_elements(By.CSS_SELECTOR, "details.schema")
    assert len(schemas) == len(doc["components"]["schemas"])
    # the filter narrows the list
    browser.find_element(By.ID, "filter").send_keys("get /metrics")
    visible = [e for e in browser.find_elements(By.CSS_SELECTOR, "details.op") if e.is_displayed()]
    assert len(visible) == 1
    # a schema's address opens it (the links in the operations use these)
    name = min(doc["components"]["schemas"])
    browser.execute_script(f"location.hash = '#schema-{name}'")
    detail = browser.find_element(By.ID, f"schema-{name}")
    WebDriverWait(browser, 10).until(lambda d: detail.get_attribute("open") is not None)
    # no script or style was refused by the page's own policy
    refused = [
        e["message"]
        for e in browser.get_log("browser")
        if "Content Security Policy" in e["message"] or "Refused" in e["message"]
    ]
    assert refused == []


def test_docs_page_without_a_token_is_refused(stack: Stack) -> None:
    r = httpx.get(f"{stack.base_url}/docs")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
