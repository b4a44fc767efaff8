"""Tokenizing a conversation's next turn from where its last turn left off.

An agent's turn n+1 renders to a prompt whose first part is turn n's prompt; tokenizing it
from scratch costs about a second per megabyte of text, for ids already computed. This
module keeps the ids of recent prompts and encodes only what follows the longest cached
prefix, giving exactly the ids a full encoding gives.

Why the splice is exact. A Hugging Face `tokenizers` encoding first cuts the text at its
added tokens (leftmost-longest matches over the raw text for the tokens that are not
`normalized`), then normalizes, pre-tokenizes and models each piece on its own; what a
piece becomes depends only on its own text and on whether it starts the input (Metaspace's
`prepend_scheme: first`). So the text can be cut before an *anchor* (a special token that
the tokenizer always extracts where its text occurs, and nothing else can swallow) and each
part, starting with its anchor, encoded alone: the concatenation is the full encoding. The
anchors are chosen when the encoder is built (`anchor_tokens`); a tokenizer for which the
argument does not hold (truncation, padding, BPE dropout, no usable anchor) gets no cache:
every prompt is encoded whole, as before. Chat templates write such tokens between turns
(`<|im_start|>`, `<|eot_id|>`, `</s>`), so a next turn re-encodes from the start of the
last turn that it shares with the cached prompt. tests/tokenization/test_incremental.py
checks the equality on real vocabularies and chat templates over random conversations.

Finding the cached prefix costs one pass of xxh3 over the prompt: every cached prompt is
indexed by the digests of its first k x `chunk_chars` characters, a new prompt's longest
indexed prefix names the entry, and the text itself is then compared (a digest collision
cannot splice wrong ids). The cache is bounded in bytes (prompt text, ids as 4-byte
integers, index) and least recently used entries go first; a turn that extends a cached
prompt replaces it (the longer entry answers everything the shorter one did).
"""

from __future__ import annotations

import re
import sys
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import xxhash
from tokenizers import Tokenizer

#: Default bytes of cached prompts (text and ids) per tokenizer: about 75 conversations of
#: 100k tokens of English text and code (0.85 MiB each, bench/tokenize_turns.py).
DEFAULT_CACHE_BYTES = 64 << 20
#: Prompt characters per digest of the prefix index. Prompts shorter than one chunk are not
#: cached (they tokenize in well under a millisecond); the match itself is exact to the
#: character whatever the chunk (the last chunk is compared by bisection).
DEFAULT_CHUNK_CHARS = 4096
#: Index bookkeeping per digest (dict slot, 16-byte key, list slot), for the byte bound.
_KEY_BYTES = 120

BatchEncode = Callable[[list[str]], Sequence[Any]]


def anchor_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """The special tokens a prompt may be cut before (content -> id), per the argument in
    the module docstring: special, matched on the raw text (not `normalized`), no
    `lstrip` / `rstrip` / `single_word`, no whitespace or word character at either end
    (so a neighbour's stripping or word test cannot reach into it), no overlap with itself
    and no other raw-matched added token containing it or overlapping it. Empty when the
    tokenizer's output is not a pure function of each piece (truncation, padding, dropout)."""
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return {}
    if getattr(tokenizer.model, "dropout", None):
        return {}
    added = tokenizer.get_added_tokens_decoder()
    raw = [t.content for t in added.values() if not t.normalized and t.content]
    anchors: dict[str, int] = {}
    for token_id, tok in added.items():
        c = tok.content
        if not (tok.special and c) or tok.normalized or tok.lstrip or tok.rstrip:
            continue
        if tok.single_word or _edge_is_word_or_space(c[0]) or _edge_is_word_or_space(c[-1]):
            continue
        if any(c[:k] == c[-k:] for k in range(1, len(c))):
            continue
        if any(t != c and _overlaps(t, c) for t in raw):
            continue
        anchors[c] = token_id
    return anchors


def _edge_is_word_or_space(ch: str) -> bool:
    return ch.isspace() or ch.isalnum() or ch == "_"


def _overlaps(other: str, anchor: str) -> bool:
    """Whether a match of `other` could cover part of an occurrence of `anchor`: it contains
    it, or a proper suffix of it is a prefix of the anchor (it starts earlier and wins), or a
    proper prefix of it is a suffix of the anchor (the anchor starts earlier; harmless for
    the anchor, but then the other token's own matches differ at a cut)."""
    if anchor in other:
        return True
    n = min(len(other), len(anchor))
    return any(other.endswith(anchor[:k]) or other.startswith(anchor[-k:]) for k in range(1, n))


@dataclass(slots=True, eq=False)
class _Entry:
    """One cached prompt: its text, its ids, and where each part begins (`cuts`: its first
    character, 0 then each anchor's offset; `starts`: the index of its first id)."""

    text: str
    ids: array[int]
    cuts: array[int]
    starts: array[int]
    keys: list[bytes] = field(default_factory=list)
    size: int = 0


@dataclass(slots=True)
class CacheStats:
    """What the cache did, for the bench and tests: prompts encoded whole (`misses`), from
    a cached prefix (`hits`), the characters and tokens reused, and what it holds."""

    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    encoded_chars: int = 0
    entries: int = 0
    bytes: int = 0


class IncrementalEncoder:
    """Encodes prompts (no special tokens added) with a bounded cache of recent prompts'
    ids, re-encoding only from the last anchor inside the longest cached prefix.

    Owns its cache (one per tokenizer); thread-safe: the index is touched under a lock,
    encoding runs outside it (`batch_encode` releases the GIL, as LocalTokenizer's does)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        batch_encode: BatchEncode,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
    ) -> None:
        self._batch_encode = batch_encode
        self.anchors = anchor_tokens(tokenizer)
        self.max_bytes = max_bytes
        self.chunk_chars = max(1, chunk_chars)
        #: Longest first: at one position the longest anchor wins, as in the tokenizer (and
        #: anchor_tokens keeps no anchor that is a prefix of another anyway).
        self._cut = (
            re.compile("|".join(re.escape(a) for a in sorted(self.anchors, key=len, reverse=True)))
            if self.anchors
            else None
        )
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[bytes, _Entry] = {}
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self._cut is not None and self.max_bytes > 0

    def encode(self, text: str) -> list[int]:
        """The ids of `text` encoded without added special tokens: exactly
        `batch_encode([text])[0].ids`."""
        if not self.enabled or len(text) < self.chunk_chars:
            return list(self._batch_encode([text])[0].ids)
        keys = self._digests(text)
        with self._lock:
            entry, chunks = self._lookup(keys)
            if entry is not None:
                self._entries.move_to_end(id(entry))
        part = 0
        if entry is not None:
            part = self._reusable_parts(entry, text, self._shared_prefix(entry, text, chunks))
        if part:
            assert entry is not None
            reuse_chars, reuse_tokens = entry.cuts[part], entry.starts[part]
            tail, tail_cuts, tail_starts = self._encode_parts(text, reuse_chars)
            ids = entry.ids[:reuse_tokens]
            ids.extend(tail)
            cuts = entry.cuts[:part]
            cuts.extend(tail_cuts)
            starts = entry.starts[:part]
            starts.extend(s + reuse_tokens for s in tail_starts)
            result = ids.tolist()
        else:
            reuse_chars = reuse_tokens = 0
            result, cut_list, start_list = self._encode_parts(text, 0)
            ids, cuts, starts = array("I", result), array("I", cut_list), array("I", start_list)
        fresh = _Entry(text, ids, cuts, starts, keys)
        fresh.size = sys.getsizeof(text) + ids.itemsize * len(ids) + 8 * len(cuts)
        fresh.size += _KEY_BYTES * len(keys)
        with self._lock:
            if part:
                self.stats.hits += 1
                self.stats.reused_tokens += reuse_tokens
            else:
                self.stats.misses += 1
            self.stats.encoded_chars += len(text) - reuse_chars
            # a prompt that extends the whole cached one answers all that one did
            if entry is not None and id(entry) in self._entries and text.startswith(entry.text):
                self._drop(entry)
            self._insert(fresh)
        return result

    # ---- parts ---------------------------------------------------------------------------

    def _encode_parts(self, text: str, start: int) -> tuple[list[int], list[int], list[int]]:
        """Encodes text[start:] (start: 0 or an anchor's offset) as parts, each cut before
        an anchor and encoded alone: the ids, each part's character offset and the index of
        its first id (both from `start`'s part on)."""
        assert self._cut is not None
        bounds = [start]
        bounds.extend(c for m in self._cut.finditer(text, start) if (c := m.start()) > start)
        bounds.append(len(text))
        parts = [text[a:b] for a, b in pairwise(bounds)]
        ids: list[int] = []
        starts: list[int] = []
        for enc in self._batch_encode(parts):
            starts.append(len(ids))
            ids.extend(enc.ids)
        return ids, bounds[:-1], starts

    def _reusable_parts(self, entry: _Entry, text: str, shared: int) -> int:
        """How many of the entry's parts `text`, which shares the entry's first `shared`
        characters, reuses: those before the last of the entry's cuts, within the shared
        text, where `text` has an anchor too (its parts before that cut are then the
        entry's: the same characters, and anchors never overlap). 0: none."""
        assert self._cut is not None
        cuts = entry.cuts
        part = bisect_right(cuts, shared) - 1
        while part > 0 and self._cut.match(text, cuts[part]) is None:
            part -= 1
        return max(part, 0)

    # ---- the prefix index ----------------------------------------------------------------

    def _digests(self, text: str) -> list[bytes]:
        """xxh3-128 of text[: k * chunk_chars] for each whole chunk (surrogatepass keeps
        the encoding injective for the lone surrogates JSON can carry)."""
        h = xxhash.xxh3_128()
        step = self.chunk_chars
        keys = []
        for k in range(step, len(text) + 1, step):
            h.update(text[k - step : k].encode("utf-8", "surrogatepass"))
            keys.append(h.digest())
        return keys

    def _lookup(self, keys: list[bytes]) -> tuple[_Entry | None, int]:
        """The entry indexed under the longest of `keys`, and how many chunks match."""
        for k in range(len(keys), 0, -1):
            entry = self._index.get(keys[k - 1])
            if entry is not None:
                return entry, k
        return None, 0

    def _shared_prefix(self, entry: _Entry, text: str, chunks: int) -> int:
        """The characters `text` shares with the entry's prompt from the start (0 when the
        digest match was a collision)."""
        cached = entry.text
        if text.startswith(cached):
            return len(cached)
        lo = chunks * self.chunk_chars
        if text[:lo] != cached[:lo]:
            return 0
        hi = min(len(text), len(cached), lo + self.chunk_chars)
        while lo < hi:  # the longest equal prefix, by bisection within one chunk
            mid = (lo + hi + 1) // 2
            if text[lo:mid] == cached[lo:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _insert(self, entry: _Entry) -> None:
        if entry.size > self.max_bytes or not entry.keys:
            return
        self._entries[id(entry)] = entry
        for key in entry.keys:
            self._index[key] = entry
        self.stats.entries += 1
        self.stats.bytes += entry.size
        while self.stats.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries.values())))

    def _drop(self, entry: _Entry) -> None:
        del self._entries[id(entry)]
        for key in entry.keys:
            if self._index.get(key) is entry:
                del self._index[key]
        self.stats.entries -= 1
        self.stats.bytes -= entry.size
