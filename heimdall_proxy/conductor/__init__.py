"""The KV cache indexer service (`heimdall-proxy conductor`): see README.md."""
