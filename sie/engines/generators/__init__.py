"""Generation engines (transformers, vLLM, an upstream OpenAI server) with their shared
helpers: GGUF loading (``gguf``), padded KV batching (``kv_batch``) and the in-flight
request table (``inflight``)."""
