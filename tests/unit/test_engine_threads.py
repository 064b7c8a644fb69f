"""sie.engines.runtime.threads: engine slots per model and torch threads per engine call."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import Any

import pytest
import torch

from sie.engines.runtime.threads import CallThreads, cpu_cores, engine_slots


class Plain:
    pass


class Concurrent:
    concurrent_calls = 8


def test_engine_slots_respect_engine_device_and_setting() -> None:
    assert engine_slots(Plain(), "cpu", 4) == 1  # not declared thread-safe
    assert engine_slots(Concurrent(), "cpu", 2) == 2
    assert engine_slots(Concurrent(), "cpu", 16) == 8  # the engine's own cap
    assert engine_slots(Concurrent(), "cuda:0", 4) == 1  # calls queue on the device


class WantsMore:
    concurrent_calls = 8
    wanted_engine_slots = 4


def test_an_engine_that_wants_more_slots_gets_them_within_its_cap() -> None:
    assert engine_slots(WantsMore(), "cpu", 2) == 4  # more than the setting
    assert engine_slots(WantsMore(), "cpu", 6) == 6  # the setting, when larger
    over = WantsMore()
    over.wanted_engine_slots = 32
    assert engine_slots(over, "cpu", 2) == 8  # the engine's own cap still holds
    assert engine_slots(WantsMore(), "cuda:0", 2) == 1


def test_cpu_cores_is_the_affinity() -> None:
    assert 1 <= cpu_cores() <= (torch.get_num_threads() + 64)


def test_a_lone_call_gets_every_core_overlapping_calls_share_them() -> None:
    threads = CallThreads(cores=4)
    seen: dict[str, int] = {}
    first_inside = threading.Event()
    release_first = threading.Event()

    def run(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        seen[str(key)] = torch.get_num_threads()
        if key == "first":
            first_inside.set()
            release_first.wait(5)
        return list(payloads)

    call = threads.wrap(run)
    call("alone", [1])
    assert seen["alone"] == 4 and threads.running == 0

    t = threading.Thread(target=call, args=("first", [1]))
    t.start()
    assert first_inside.wait(5)
    call("second", [1])  # overlaps "first": 4 cores // 2 calls
    release_first.set()
    t.join(5)
    assert seen["first"] == 4 and seen["second"] == 2
    assert threads.running == 0


def test_a_failing_call_is_no_longer_counted() -> None:
    threads = CallThreads(cores=2)

    def boom(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        raise RuntimeError("kaput")

    with pytest.raises(RuntimeError):
        threads.wrap(boom)(None, [1])
    assert threads.running == 0
