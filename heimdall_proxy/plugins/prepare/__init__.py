from heimdall_proxy.plugins.prepare import tokenizer

__all__ = ["tokenizer"]
