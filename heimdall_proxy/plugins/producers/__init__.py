"""Producers: plugins whose work runs once per request before the profiles (predictions)."""
