"""The endpoint pool and what feeds it: vLLM /metrics scraping, /v1/models discovery, health."""
