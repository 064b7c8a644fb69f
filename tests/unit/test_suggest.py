"""Close-match hints for unknown model ids (sie.core.suggest; docs/api.md §15)."""

from __future__ import annotations

import time

from sie.core.suggest import MAX_CANDIDATES, close_ids, model_not_found

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
KNOWN = [
    MINILM,
    f"{MINILM}:onnx",
    "rasyosef/splade-tiny",
    "nationaldesignstudio/rampart",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
]


def test_typos_case_and_a_missing_organisation_find_the_id() -> None:
    assert close_ids("sentence-transformers/all-MiniLM-L6-v3", KNOWN)[0] == MINILM
    assert close_ids("SENTENCE-TRANSFORMERS/ALL-MINILM-L6-V2", KNOWN)[0] == MINILM
    assert close_ids("all-MiniLM-L6-v2", KNOWN)[:2] == [MINILM, f"{MINILM}:onnx"]
    assert close_ids("splade-tiny", KNOWN) == ["rasyosef/splade-tiny"]
    assert close_ids(f"{MINILM}:onxx", KNOWN)[0] == f"{MINILM}:onnx"


def test_nothing_close_and_degenerate_queries_suggest_nothing() -> None:
    assert close_ids("nope/nothing", KNOWN) == []
    assert close_ids("", KNOWN) == []
    assert close_ids("x" * 300, KNOWN) == []
    assert close_ids("gpt-4", []) == []


def test_the_error_names_the_suggestions() -> None:
    one = model_not_found("splade-tiny", KNOWN)
    assert one.status == 404 and one.code == "MODEL_NOT_FOUND"
    assert one.message == "model 'splade-tiny' not found; did you mean 'rasyosef/splade-tiny'?"
    assert one.fields == {"model": "splade-tiny", "suggestions": ["rasyosef/splade-tiny"]}
    none = model_not_found("nope/nothing", KNOWN)
    assert none.message == "model 'nope/nothing' not found" and none.fields["suggestions"] == []
    many = model_not_found("all-MiniLM-L6-v2", KNOWN)
    assert many.message.endswith(f"did you mean one of {MINILM!r}, {f'{MINILM}:onnx'!r}?")


def test_work_is_bounded_by_the_candidate_cap() -> None:
    alike = [f"sentence-transformers/all-MiniLM-L6-v{i}:onnx" for i in range(10 * MAX_CANDIDATES)]
    started = time.process_time()
    got = close_ids("sentence-transformers/all-MiniLM-L6-v2:onnx-int8", alike)
    assert len(got) == 3 and all(g in alike[:MAX_CANDIDATES] for g in got)
    assert time.process_time() - started < 2.0  # ~0.1 s here; 10x that unbounded


def test_an_unknown_profile_of_a_known_model_lists_its_profiles() -> None:
    known = [*KNOWN, f"{MINILM}:onnx-int8", f"{MINILM}:fastest", f"{MINILM}:default"]
    err = model_not_found(f"{MINILM}:nosuch", known)
    assert err.status == 404 and err.code == "MODEL_NOT_FOUND"
    ids = [
        MINILM,
        f"{MINILM}:default",
        f"{MINILM}:fastest",
        f"{MINILM}:onnx",
        f"{MINILM}:onnx-int8",
    ]
    assert sorted(err.fields["suggestions"]) == sorted(ids)  # every one, however unlike
    assert err.message.startswith(
        f"model '{MINILM}:nosuch' not found: '{MINILM}' has no profile 'nosuch'; its ids: "
    )
    typo = model_not_found(f"{MINILM}:onxx", known)  # the closest first
    assert (
        typo.fields["suggestions"][0] == f"{MINILM}:onnx" and len(typo.fields["suggestions"]) == 5
    )
    assert model_not_found("nope/x:onnx", known).fields["suggestions"] == []  # unknown base
