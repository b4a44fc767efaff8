"""Data-layer plugins: sources a pod is polled through, and extractors of what they return.

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
