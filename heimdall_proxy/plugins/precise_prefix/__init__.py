"""Precise prefix-cache routing: the producer and scorer fed by pods' KV-cache events, their
shared parameters and index construction."""
