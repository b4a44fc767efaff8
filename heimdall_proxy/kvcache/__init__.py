"""KV-cache awareness: block hashing, vLLM KV-event decoding, block index backends and the
ZMQ subscriber that keeps an index in step with the pods' caches."""
