from heimdall_proxy.plugins.filters import by_label, by_label_selector, role

__all__ = ["by_label", "by_label_selector", "role"]
