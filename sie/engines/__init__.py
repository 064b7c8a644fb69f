"""Model engines and the worker-side runtime (batching, loaded-model cache)."""
