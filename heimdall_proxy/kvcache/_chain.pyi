from collections.abc import Sequence

def block_keys(
    tokens: Sequence[int], block_size: int, seed: int, parent: int | None, n: int
) -> list[int]: ...
