"""tokenizersPoolConfig.hf: the Hugging Face cache and Hub, through the Hub's own client,
tested offline (HF_HUB_OFFLINE=1, set by tests/conftest.py) against a prepared cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from heimdall_proxy.tokenization.resolve import (
    HFCacheSearch,
    TokenizerNotFoundError,
    download_tokenizer,
    find_tokenizer,
)
from tests.helpers import COMMIT, hub_cache


@pytest.fixture
def tokenizer_file(tmp_path: Path) -> Path:
    from tests.tokenization.model import make_model_dir  # the suite's tiny tokenizer

    return make_model_dir(tmp_path / "src") / "tokenizer.json"


def test_the_hub_client_reads_its_cache_offline(tmp_path: Path, tokenizer_file: Path) -> None:
    cached = hub_cache(tmp_path / "cache", "org/tok", tokenizer_file)
    hf = HFCacheSearch(cache_dir=str(tmp_path / "cache"), repo="org/tok", download=True)
    got = download_tokenizer("some-model", hf)
    assert got.read_bytes() == cached.read_bytes()


def test_hf_tokenizer_names_the_repo_and_the_revision_is_honoured(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    hub_cache(tmp_path / "cache", "org/tok", tokenizer_file, revision="v2")
    hf = HFCacheSearch(cache_dir=str(tmp_path / "cache"), revision="v2", repo="org/tok")
    found = find_tokenizer("served-name", hf=hf, sources=["hf"])
    assert found.name == "tokenizer.json" and COMMIT in str(found)
    with pytest.raises(TokenizerNotFoundError):
        find_tokenizer("served-name", hf=HFCacheSearch(cache_dir=str(tmp_path / "cache"),
                       revision="v3", repo="other/repo"), sources=["hf"])  # fmt: skip


def test_offline_and_not_cached_says_where_it_looked(tmp_path: Path) -> None:
    hf = HFCacheSearch(cache_dir=str(tmp_path / "empty"), repo="org/missing")
    with pytest.raises(TokenizerNotFoundError) as info:
        find_tokenizer("m", hf=hf, sources=["hf"])
    message = str(info.value)
    assert "the Hugging Face Hub (org/missing:" in message
    assert "HF_TOKEN" in message
