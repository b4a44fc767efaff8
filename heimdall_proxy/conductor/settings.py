"""The conductor's config file (`--config FILE`, YAML): limits, the hash seed, and
publishers to register at start-up, each written as a POST /register body.

```yaml
hashSeed: 1337
maxQueryTokens: 1048576
maxQueryBlocks: 65536
maxInstances: 256          # per tenant in one answer
maxBlocksPerMedium: 50000000
replayTimeout: 1s
duplicateWindow: 1024
ingestWorkers: 0           # processes decoding vLLM batches (0: on the event loop)
publishers:
- {endpoint: "tcp://10.0.0.7:5557", replay_endpoint: "tcp://10.0.0.7:5558", type: vLLM,
   modelname: llama, instance_id: vllm-0, block_size: 16, dp_rank: 0}
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from heimdall_proxy.conductor.api import ApiError, as_object, parse_register
from heimdall_proxy.conductor.model import Registration
from heimdall_proxy.conductor.service import ServiceOptions
from heimdall_proxy.framework.params import Duration, HashSeed


class ConductorSettingsError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


#: The service's own defaults, so the file's defaults are stated once (in ServiceOptions).
_DEFAULTS = ServiceOptions()


class ConductorSettings(BaseModel):
    """The service's `--config` file (the scorer's `conductorConfig` block, which points a
    gateway at a conductor, is plugins.scorers.precise_prefix_params.ConductorConfig)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    hash_seed: HashSeed = _DEFAULTS.hash_seed
    max_query_tokens: int = Field(default=_DEFAULTS.max_query_tokens, gt=0)
    max_query_blocks: int = Field(default=_DEFAULTS.max_query_blocks, gt=0)
    max_instances: int = Field(default=_DEFAULTS.max_instances, gt=0)
    max_blocks_per_medium: int = Field(default=_DEFAULTS.max_blocks_per_medium, gt=0)
    replay_timeout: Duration = _DEFAULTS.replay_timeout
    duplicate_window: int = Field(default=_DEFAULTS.duplicate_window, ge=0)
    #: 0 (inline) by default: on a 2-CPU machine shared with other work a worker measured
    #: slower end to end (bench/RESULTS.md); give it the spare cores a machine has
    ingest_workers: int = Field(default=_DEFAULTS.ingest_workers, ge=0, le=64)
    publishers: list[dict[str, Any]] = Field(default_factory=list)

    def options(self, hash_seed: int | None = None) -> ServiceOptions:
        """The service's options from this file; `hash_seed` (the --hash-seed flag) wins,
        checked by this model's `hashSeed` field (its range: framework.params.HashSeed).
        Raises ConductorSettingsError."""
        values = self.model_dump(exclude={"publishers"})
        if hash_seed is not None:
            try:
                checked = type(self).model_validate({"hash_seed": hash_seed})
            except ValidationError as exc:
                raise ConductorSettingsError(f"--hash-seed: {exc.errors()[0]['msg']}") from None
            values["hash_seed"] = checked.hash_seed
        return ServiceOptions(**values)

    def registrations(self) -> list[Registration]:
        out = []
        for i, body in enumerate(self.publishers):
            try:
                out.append(parse_register(as_object(body)))
            except ApiError as exc:
                raise ConductorSettingsError(f"publishers[{i}]: {exc.message}") from None
        return out


def load_config(path: str | None) -> ConductorSettings:
    """The config at `path` (None: the defaults). Raises ConductorSettingsError."""
    if path is None:
        return ConductorSettings()
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
        config = ConductorSettings.model_validate(doc)
        config.registrations()
    except (OSError, yaml.YAMLError) as exc:
        raise ConductorSettingsError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        raise ConductorSettingsError(f"{path}: {exc}") from exc
    except ConductorSettingsError as exc:
        raise ConductorSettingsError(f"{path}: {exc}") from exc
    return config
