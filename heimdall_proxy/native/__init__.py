"""The C extensions, with their type stubs: the KV block-hash chain, token-id packing, the
conductor's u64 map and its vLLM KV-event ingest. Built by setup.py; every caller has a Python
fallback."""
