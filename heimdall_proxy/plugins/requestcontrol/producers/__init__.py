"""Producers: plugins that compute a datum once per request (in-flight load, a prefix match,
token ids) for every reader."""
