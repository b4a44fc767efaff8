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
from heimdall_proxy.conductor.hashing import DEFAULT_HASH_SEED
from heimdall_proxy.conductor.model import Registration
from heimdall_proxy.conductor.service import ServiceOptions
from heimdall_proxy.framework.params import Duration


class ConductorConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


class ConductorConfig(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    hash_seed: int = Field(default=DEFAULT_HASH_SEED, ge=0, lt=1 << 64)
    max_query_tokens: int = Field(default=1 << 20, gt=0)
    max_query_blocks: int = Field(default=1 << 16, gt=0)
    max_instances: int = Field(default=256, gt=0)
    max_blocks_per_medium: int = Field(default=50_000_000, gt=0)
    replay_timeout: Duration = 1.0
    duplicate_window: int = Field(default=1024, ge=0)
    publishers: list[dict[str, Any]] = Field(default_factory=list)

    def options(self, hash_seed: int | None = None) -> ServiceOptions:
        return ServiceOptions(
            hash_seed=self.hash_seed if hash_seed is None else hash_seed,
            max_query_tokens=self.max_query_tokens,
            max_query_blocks=self.max_query_blocks,
            max_instances=self.max_instances,
            max_blocks_per_medium=self.max_blocks_per_medium,
            replay_timeout=self.replay_timeout,
            duplicate_window=self.duplicate_window,
        )

    def registrations(self) -> list[Registration]:
        out = []
        for i, body in enumerate(self.publishers):
            try:
                out.append(parse_register(as_object(body)))
            except ApiError as exc:
                raise ConductorConfigError(f"publishers[{i}]: {exc.message}") from None
        return out


def load_config(path: str | None) -> ConductorConfig:
    """The config at `path` (None: the defaults). Raises ConductorConfigError."""
    if path is None:
        return ConductorConfig()
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
        config = ConductorConfig.model_validate(doc)
        config.registrations()
    except (OSError, yaml.YAMLError) as exc:
        raise ConductorConfigError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        raise ConductorConfigError(f"{path}: {exc}") from exc
    except ConductorConfigError as exc:
        raise ConductorConfigError(f"{path}: {exc}") from exc
    return config
