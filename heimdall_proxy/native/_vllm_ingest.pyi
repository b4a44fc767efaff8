from heimdall_proxy.native._u64map import U64Map

def scan(payload: bytes, /) -> tuple[float, int | None, str | None, int] | None: ...
def apply(
    payload: bytes,
    engine_map: U64Map,
    index: U64Map,
    bit: int,
    seed: int,
    block_size: int,
    max_keys: int,
    removals: bool,
    /,
) -> tuple[int, int, int, int, int, int, int]: ...
