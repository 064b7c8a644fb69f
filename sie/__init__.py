"""SIE: an inference engine for embeddings, reranking, extraction and generation.

``import sie`` is cheap: it imports no torch, vLLM or nats. Heavy libraries are
imported lazily inside the adapters that need them.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
