"""Admitters: plugins that may refuse a request after the producers ran, before scheduling."""
