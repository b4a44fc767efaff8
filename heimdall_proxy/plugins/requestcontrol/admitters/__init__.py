"""Admitters: plugins that may refuse a request after the producers ran and before it is
scheduled; server/admission.py is the one place that asks them."""
