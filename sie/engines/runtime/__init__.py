"""The worker-side engine runtime (docs/architecture.md §16.2): the loaded-model cache
under a memory budget (``cache``), the token-budget batcher (``batching``), the
engine call threads (``threads``) and the engine-state observer the admission gate
reads (``observer``). Engine adapters live beside it, grouped by kind."""
