"""Finding a model's tokenizer.json: on local disk, in the Hugging Face caches, and else
downloaded from the Hugging Face Hub with its own client (token, revision, cache directory;
`HF_HUB_OFFLINE=1` keeps it to the caches)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"


def model_spec(spec: str) -> tuple[str, str]:
    """A `[NAME=]MODEL` spec (tokenizer-server's --model, --mistral-model) as (NAME, MODEL);
    NAME defaults to MODEL."""
    name, sep, model = spec.partition("=")
    return (name, model) if sep else (spec, spec)


class TokenizerNotFoundError(LookupError):
    """No tokenizer file for a model in any of the places searched; the message lists them."""


@dataclass(slots=True, frozen=True)
class LocalSearch:
    """The `local` tokenizer source: an explicit model -> path map, then a directory scanned
    for `<dir>/<model>/<file>` (the EPP's auto-discovery)."""

    auto_discovery_dir: str = "/mnt/models"
    file_name: str = TOKENIZER_FILE
    model_tokenizer_map: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class HFCacheSearch:
    """The `hf` tokenizer source: a tokenizers cache directory and the Hugging Face hub cache
    (`$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`), then, with `download`,
    the Hub itself (into `cache_dir`). `repo` names the Hub repository when it is not the
    model name (the reference's `hf.tokenizer`); `token` defaults to `$HF_TOKEN`."""

    cache_dir: str | None = None
    revision: str | None = None
    repo: str | None = None
    token: str | None = field(default=None, repr=False)
    download: bool = True


#: Fetched beside tokenizer.json when present: the chat template lives there.
_COMPANIONS = ("tokenizer_config.json",)


def download_tokenizer(model: str, hf: HFCacheSearch, file_name: str = TOKENIZER_FILE) -> Path:
    """`file_name` (tokenizer.json) of `hf.repo or model` from the Hugging Face Hub (or its
    cache when offline). Raises OSError / the hub client's errors."""
    from huggingface_hub import hf_hub_download

    repo = hf.repo or model
    path = hf_hub_download(
        repo, file_name, revision=hf.revision, cache_dir=hf.cache_dir, token=hf.token
    )
    for name in _COMPANIONS:
        with contextlib.suppress(Exception):  # optional companion files
            hf_hub_download(
                repo, name, revision=hf.revision, cache_dir=hf.cache_dir, token=hf.token
            )
    return Path(path)


def _file_in(path: Path, file_name: str) -> Path | None:
    if path.is_file():
        return path
    candidate = path / file_name
    return candidate if candidate.is_file() else None


def hub_cache_dirs(extra: str | None = None) -> list[Path]:
    dirs: list[Path] = []
    if extra:
        dirs.append(Path(extra).expanduser())
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def _in_hub_cache(root: Path, model: str, revision: str | None, file_name: str) -> Path | None:
    """`root/<model>/<file>` or the hub layout `root/models--org--name/snapshots/<rev>/<file>`
    (`refs/<revision or main>` names the snapshot when present)."""
    direct = _file_in(root / model, file_name)
    if direct is not None:
        return direct
    repo = root / ("models--" + model.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / (revision or "main")
    if ref.is_file():
        found = _file_in(snapshots / ref.read_text().strip(), file_name)
        if found is not None:
            return found
    if revision:
        found = _file_in(snapshots / revision, file_name)
        if found is not None:
            return found
    for snap in sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        found = _file_in(snap, file_name)
        if found is not None:
            return found
    return None


def find_tokenizer(
    model: str,
    local: LocalSearch | None = None,
    hf: HFCacheSearch | None = None,
    sources: Sequence[str] = ("path", "local", "hf"),
    hub_file: str = TOKENIZER_FILE,
) -> Path:
    """The tokenizer file for `model`, searched in `sources` order: `path` (the model name is
    itself a tokenizer file or a directory holding one), `local`, `hf` (offline caches, then
    the Hub), where the file is `hub_file` (tokenizer.json; tekken.json for a Mistral model).
    Raises TokenizerNotFoundError naming every place looked at."""
    local = local or LocalSearch()
    hf = hf or HFCacheSearch()
    looked: list[str] = []
    for source in sources:
        if source == "path":
            p = Path(model).expanduser()
            looked.append(str(p))
            found = _file_in(p, local.file_name) if p.exists() else None
        elif source == "local":
            found = None
            mapped = local.model_tokenizer_map.get(model)
            if mapped:
                p = Path(mapped).expanduser()
                looked.append(f"{p} (modelTokenizerMap)")
                found = _file_in(p, local.file_name)
                if found is None:
                    raise TokenizerNotFoundError(
                        f"modelTokenizerMap maps model {model!r} to {str(p)!r}, which is neither "
                        f"a tokenizer file nor a directory holding {local.file_name!r}"
                    )
            if found is None and local.auto_discovery_dir:
                p = Path(local.auto_discovery_dir).expanduser() / model
                looked.append(str(p / local.file_name))
                found = _file_in(p, local.file_name)
        elif source == "hf":
            found = None
            for root in hub_cache_dirs(hf.cache_dir):
                looked.append(f"{root} (Hugging Face cache)")
                found = _in_hub_cache(root, hf.repo or model, hf.revision, hub_file)
                if found is not None:
                    break
            if found is None and hf.download:
                try:
                    found = download_tokenizer(model, hf, hub_file)
                except Exception as exc:
                    looked.append(
                        f"the Hugging Face Hub ({hf.repo or model}: {type(exc).__name__})"
                    )
        else:  # pragma: no cover - callers pass known names
            raise ValueError(f"unknown tokenizer source {source!r}")
        if found is not None:
            return found
    raise TokenizerNotFoundError(
        f"no tokenizer for model {model!r}: looked in " + ", ".join(looked) + ". Copy the "
        "model's tokenizer.json (with tokenizer_config.json for chat) to one of those places, "
        "map the model to it with local.modelTokenizerMap, or let the gateway reach the Hub "
        "(hf.huggingFaceToken or HF_TOKEN for gated models)"
    )
