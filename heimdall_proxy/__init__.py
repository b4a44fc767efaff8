"""heimdall-proxy: an OpenAI-compatible LLM request router running Heimdall's endpoint-picker
plugins in-process in front of vLLM."""

__version__ = "0.1.0"
