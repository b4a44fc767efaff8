from __future__ import annotations

from pathlib import Path

import pytest

from heimdall_proxy.tokenization.local import LocalTokenizer
from tests.tokenization.model import make_model_dir


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "tiny-model")


@pytest.fixture
def tok(model_dir: Path) -> LocalTokenizer:
    return LocalTokenizer(model_dir / "tokenizer.json")
