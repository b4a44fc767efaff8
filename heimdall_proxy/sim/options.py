"""Every knob of one simulated pod, with defaults that make it behave roughly like vLLM V1
serving a 7-8B model on one GPU (see README.md next to this file for the reasoning)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

KVEventsFormat = Literal["map", "array"]
KVHashFormat = Literal["int", "bytes"]
Role = Literal["both", "prefill", "decode", "encode"]


@dataclass(slots=True)
class SimOptions:
    # ---- identity -----------------------------------------------------------------------
    name: str = "sim-0"
    model: str = "sim-model"
    #: LoRA adapters served besides the base model (read live: tests may append).
    lora_modules: list[str] = field(default_factory=list)
    #: Adapters resident on the GPU at once (vLLM --max-loras).
    max_loras: int = 1
    #: Disaggregation role: "encode" serves only the multimodal encoder; the others behave
    #: as vLLM does with a NIXL connector (what a request does is set by kv_transfer_params).
    role: Role = "both"
    #: vLLM's --api-key: every /v1 route then needs `Authorization: Bearer <key>` (401).
    api_key: str | None = None

    # ---- scheduler (vLLM V1) ------------------------------------------------------------
    max_num_seqs: int = 256
    #: Token budget of one engine step; chunked prefill splits longer prompts.
    max_num_batched_tokens: int = 2048
    max_model_len: int = 32768
    default_max_tokens: int = 16

    # ---- KV cache -----------------------------------------------------------------------
    block_size: int = 16
    num_gpu_blocks: int = 4096
    enable_prefix_caching: bool = True
    #: Blocks of a CPU tier that catches blocks evicted from the GPU (0: no CPU tier).
    cpu_offload_blocks: int = 0

    # ---- cost model (simulated seconds; every one is multiplied by time_scale) ----------
    step_base: float = 0.008
    prefill_cost_per_token: float = 0.00006
    decode_cost_per_seq: float = 0.00015
    #: Attention reads of the context of every decoding sequence, per KV token.
    kv_read_cost_per_token: float = 6e-8
    #: Loading a LoRA adapter that is not resident (charged to the step that needs it).
    lora_load_time: float = 0.2
    #: Pulling one block from a remote prefill pod (NIXL) into this pod.
    kv_transfer_cost_per_block: float = 0.0001
    #: Loading one block back from the CPU tier (cheaper than recompute, not free).
    cpu_load_cost_per_block: float = 0.0002
    #: Running the multimodal encoder on one image / audio clip (a video counts 4).
    encode_cost_per_item: float = 0.02
    #: Placeholder tokens one image or audio item adds to the prompt (a video: 4x).
    mm_tokens_per_item: int = 256
    #: Multiplies every simulated duration: 0.01 runs the pod 100x faster than a GPU.
    time_scale: float = 1.0
    #: None: the fixed output "the gateway routes tokens ...". An int: seeded, deterministic
    #: outputs per prompt (the request's own `seed` field is mixed in).
    seed: int | None = None

    # ---- KV events (ZMQ) ----------------------------------------------------------------
    #: PUB port; None or 0: no KV events; -1: any free port (tests, demo).
    kv_events_port: int | None = None
    #: ROUTER port answering replay requests; None: the PUB port + 1 (-1 with a PUB on -1).
    kv_events_replay_port: int | None = None
    kv_events_host: str = "127.0.0.1"
    #: Topic of every message; {name}, {model}, {host}, {port} are filled in.
    kv_events_topic: str = "kv@{name}@{model}"
    kv_events_format: KVEventsFormat = "map"
    kv_events_hash: KVHashFormat = "int"
    #: Batches kept for replay.
    kv_events_buffer: int = 10_000

    # ---- disaggregation -----------------------------------------------------------------
    #: Host and port written into kv_transfer_params / ec_transfer_params (the NIXL side
    #: channel of a real pod); the engine id defaults to one derived from the name.
    advertise_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    engine_id: str | None = None
    #: A directory shared by encode and prefill/decode pods standing in for the EC
    #: connector's shared storage: an encode pod writes one file per multimodal item hash,
    #: other pods skip the encoder for items found there.
    ec_storage_path: str | None = None
    #: An encode pod names its outputs in `ec_transfer_params`; off, it answers without them,
    #: as vLLM's shared-storage EC connectors do (the decode pod finds the outputs in storage).
    ec_transfer_params: bool = True
    #: Serve POST /sim/fault (benchmarks inject failures into a pod running in another
    #: process: {"fail_status": 503 | null, "health_status": 500 | null}).
    fault_control: bool = False
