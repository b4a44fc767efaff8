from heimdall_proxy.plugins.pickers import max_score, random_picker, weighted_random

__all__ = ["max_score", "random_picker", "weighted_random"]
