"""Score engines (rerankers): the sentence-transformers cross-encoder adapter."""
