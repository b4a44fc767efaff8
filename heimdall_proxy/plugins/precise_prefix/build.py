"""What precise-prefix-cache-scorer's parameters build: its tokenizer and its KV-block index."""

from __future__ import annotations

from pathlib import Path

from heimdall_proxy.kvcache.index import (
    CostAwareMemoryIndex,
    InMemoryIndex,
    KVBlockIndex,
    KVCacheStats,
)
from heimdall_proxy.kvcache.index.redis import RedisIndex
from heimdall_proxy.plugins.precise_prefix.params import (
    HFTokenizerConfig,
    InMemoryConfig,
    KVBlockIndexConfig,
    LocalTokenizerConfig,
    PrecisePrefixCacheParams,
    TokenizersPoolConfig,
    tokenizer_mode,
)
from heimdall_proxy.tokenization import InProcessTokenizer, RequestTokenizer
from heimdall_proxy.tokenization.local import LocalTokenizer
from heimdall_proxy.tokenization.mistral import (
    TEKKEN_FILE,
    MistralRequestTokenizer,
    download_mistral_tokenizer,
    mistral_file,
)
from heimdall_proxy.tokenization.resolve import (
    TOKENIZER_FILE,
    HFCacheSearch,
    LocalSearch,
    TokenizerNotFoundError,
    find_tokenizer,
)
from heimdall_proxy.tokenization.uds import UDSTokenizerClient, uds_model_name


def build_tokenizer(cfg: TokenizersPoolConfig) -> RequestTokenizer:
    """The pool's tokenizer: the UDS service when configured, else the model's local
    tokenizer file (tokenizer.json; tekken.json or tokenizer.model.v* in mistral mode): local
    discovery first, then the HF caches and the Hub. Raises ValueError."""
    if cfg.uds is not None:
        model = uds_model_name(cfg.model_name, cfg.uds.model_tokenizer_map)
        return UDSTokenizerClient(
            cfg.uds.socket_file,
            model,
            use_tcp=cfg.uds.use_tcp,
            timeout=1.0,
            max_prompt_chars=cfg.max_prompt_chars,
        )
    local = cfg.local or LocalTokenizerConfig()
    hf = cfg.hf or HFTokenizerConfig()
    sources = ["path", "local"] + (["hf"] if hf.enabled else [])
    name = local.tokenizer or cfg.model_name
    mistral = tokenizer_mode(cfg) == "mistral"
    file_name = local.auto_discovery_tokenizer_file_name
    if mistral and file_name == TOKENIZER_FILE:
        file_name = TEKKEN_FILE
    hub = HFCacheSearch(
        hf.tokenizers_cache_dir or None,
        hf.tokenizer_revision or None,
        repo=hf.tokenizer or None,
        token=hf.hugging_face_token or None,
        download=not mistral,  # a Mistral repository may hold tokenizer.model.v* instead
    )
    try:
        path = (mistral_file(Path(name).expanduser()) if mistral else None) or find_tokenizer(
            name,
            local=LocalSearch(local.auto_discovery_dir, file_name, local.model_tokenizer_map),
            hf=hub,
            sources=sources,
            hub_file=TEKKEN_FILE if mistral else TOKENIZER_FILE,
        )
    except TokenizerNotFoundError as exc:
        if not (mistral and hf.enabled):
            raise ValueError(f"indexerConfig.tokenizersPoolConfig: {exc}") from exc
        try:
            path = download_mistral_tokenizer(name, hub)
        except Exception as hub_exc:
            raise ValueError(
                f"indexerConfig.tokenizersPoolConfig: {exc}; the Hugging Face Hub has none "
                f"either ({type(hub_exc).__name__}: {hub_exc})"
            ) from exc
    try:
        tokenizer = (
            MistralRequestTokenizer(path)
            if mistral
            else LocalTokenizer(path, cfg.conversation_cache_bytes)
        )
    except ImportError as exc:
        raise ValueError(f"indexerConfig.tokenizersPoolConfig: {exc}") from exc
    return InProcessTokenizer(
        tokenizer, workers=cfg.workers_count, max_prompt_chars=cfg.max_prompt_chars
    )


def build_index(cfg: KVBlockIndexConfig, block_size: int, params: PrecisePrefixCacheParams,
                stats: KVCacheStats) -> KVBlockIndex:  # fmt: skip
    weights = params.tier_weights
    if cfg.redis_config is not None or cfg.valkey_config is not None:
        rc = cfg.redis_config or cfg.valkey_config
        assert rc is not None
        backend = "valkey" if cfg.valkey_config is not None else rc.backend_type
        return RedisIndex(
            block_size,
            rc.address,
            rc.key_prefix,
            weights,
            stats,
            backend,
            speculative=params.speculative_indexing,
        )
    if cfg.cost_aware_memory_config is not None:
        return CostAwareMemoryIndex(block_size, cfg.cost_aware_memory_config.size, weights, stats)
    mem = cfg.in_memory_config or InMemoryConfig()
    return InMemoryIndex(block_size, mem.size, mem.pod_cache_size, weights, stats)
