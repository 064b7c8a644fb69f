"""Request ids (sie.core.ids): UUIDv7 layout, order, and no repeats across threads or
a fork (the random bytes are buffered)."""

from __future__ import annotations

import os
import threading
import uuid

from sie.core.ids import uuid7


def test_layout_and_time_order() -> None:
    ids = [uuid7() for _ in range(2000)]
    for s in ids[:50]:
        u = uuid.UUID(s)
        assert u.version == 7 and u.variant == uuid.RFC_4122
    ms = [int(s.replace("-", "")[:12], 16) for s in ids]
    assert ms == sorted(ms)
    assert len(set(ids)) == len(ids)


def test_no_repeats_across_threads() -> None:
    out: list[list[str]] = [[] for _ in range(4)]

    def mint(k: int) -> None:
        out[k].extend(uuid7() for _ in range(3000))

    threads = [threading.Thread(target=mint, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [s for ids in out for s in ids]
    assert len(set(every)) == len(every) == 12000


def test_a_forked_child_does_not_reuse_the_parents_random_bytes() -> None:
    uuid7()  # the parent's buffer now holds unread bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next random tail, then leave at once
        os.write(write, uuid7()[-17:].encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert status == 0
    assert child != uuid7()[-17:]
