"""Oversized prompts are refused before they are tokenised (found by a hostile trial:
six 3.9 MB chat bodies held the generation worker for seconds each, so they got 504
with Retry-After and innocent small chats waited 25 s). Every role in one process,
default limits (4 MiB generation bodies), real HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from tests.conftest import run_stack

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_huge_prompts_are_a_fast_400_and_small_chats_are_not_held_up() -> None:
    big = json.dumps(
        {"model": LLM, "messages": [{"role": "user", "content": "word " * 780_000}]}
    ).encode()
    assert 3_800_000 < len(big) < 4 * 1024 * 1024
    small = {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with run_stack(preload=(LLM,)) as s, httpx.Client(base_url=s.base_url, timeout=60) as c:

        def post_big(_: int) -> tuple[int, float, str]:
            t0 = time.monotonic()
            r = c.post(
                "/v1/chat/completions", content=big, headers={"Content-Type": "application/json"}
            )
            return r.status_code, time.monotonic() - t0, r.text

        def post_small(_: int) -> tuple[int, float, str]:
            t0 = time.monotonic()
            r = c.post("/v1/chat/completions", json=small)
            return r.status_code, time.monotonic() - t0, r.text

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            bigs = pool.map(post_big, range(6))
            smalls = pool.map(post_small, range(6))
            bigs_, smalls_ = list(bigs), list(smalls)
    for status, took, text in bigs_:
        assert status == 400, text[:300]
        body = json.loads(text)["error"]
        assert body["param"] == "messages" and "window" in body["message"]
        assert took < 10, took
    for status, took, text in smalls_:
        assert status == 200, text[:300]
        assert took < 15, took
