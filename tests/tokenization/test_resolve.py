"""Finding tokenizer.json: the model name as a path, modelTokenizerMap, auto-discovery, HF caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from heimdall_proxy.tokenization.resolve import (
    HFCacheSearch,
    LocalSearch,
    TokenizerNotFoundError,
    find_tokenizer,
)
from tests.tokenization.model import make_model_dir


def test_path_map_and_auto_discovery(tmp_path: Path) -> None:
    d = make_model_dir(tmp_path / "org" / "model")
    assert find_tokenizer(str(d)) == d / "tokenizer.json"
    assert find_tokenizer(str(d / "tokenizer.json")) == d / "tokenizer.json"
    local = LocalSearch(auto_discovery_dir=str(tmp_path))
    assert find_tokenizer("org/model", local=local) == d / "tokenizer.json"
    mapped = LocalSearch(auto_discovery_dir="", model_tokenizer_map={"alias": str(d)})
    assert find_tokenizer("alias", local=mapped) == d / "tokenizer.json"
    bad = LocalSearch(model_tokenizer_map={"alias": str(tmp_path / "nowhere")})
    with pytest.raises(TokenizerNotFoundError, match="modelTokenizerMap maps model 'alias'"):
        find_tokenizer("alias", local=bad)


def test_hub_cache_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    repo = tmp_path / "cache" / "models--org--model"
    make_model_dir(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    found = find_tokenizer(
        "org/model", hf=HFCacheSearch(cache_dir=str(tmp_path / "cache")), sources=("hf",)
    )
    assert found == repo / "snapshots" / "abc123" / "tokenizer.json"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert find_tokenizer("org/model", sources=("hf",)) == found


def test_not_found_says_where_it_looked_including_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(TokenizerNotFoundError) as err:
        find_tokenizer("org/missing", local=LocalSearch(auto_discovery_dir=str(tmp_path)))
    msg = str(err.value)
    assert "org/missing" in msg and str(tmp_path / "hf" / "hub") in msg
    assert "the Hugging Face Hub (org/missing:" in msg  # tried through the Hub client
