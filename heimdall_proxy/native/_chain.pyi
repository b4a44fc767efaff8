from collections.abc import Sequence

def block_keys(
    tokens: Sequence[int], block_size: int, seed: int, parent: int | None, n: int
) -> list[int]: ...
def ascii_block_keys(
    text: str, chars_per_block: int, seed: int, parent: int | None, n: int
) -> list[int]: ...
