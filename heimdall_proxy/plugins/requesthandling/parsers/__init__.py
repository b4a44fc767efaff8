"""Parsers, one module per API: openai, anthropic, vllmhttp, sglanghttp, passthrough."""
