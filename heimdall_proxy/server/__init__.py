"""The aiohttp server: OpenAI routes, the upstream relay, errors."""
