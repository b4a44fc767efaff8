"""Routing state shared by active-active gateway replicas through Redis / Valkey.

Each replica keeps its own state in memory and reads it there on the request path; a
background loop per shared structure makes one pipelined round trip per tick to publish what
changed locally and to take in what the other replicas published. See README.md here.
"""
