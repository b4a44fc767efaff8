"""The compiled parts: native/_chain.c, the XXH3 rolling block keys (kvcache.hashing);
native/_tokens.c, vLLM event batches with their token ids packed as u32 before msgpack
decodes them (kvcache.events); native/_u64map.c, the conductor's maps from u64 to u64
(conductor.tables); native/_vllm_ingest.c, vLLM's plain batches applied to those maps
without Python per event (conductor.native_ingest).

Everything else is in pyproject.toml. The chain and the native ingest link the system's
libxxhash (Debian's libxxhash0, which apt itself depends on). Each is optional: where one
cannot be built, the install goes on and the Python code it speeds up runs instead (slower,
same answers)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "heimdall_proxy.native._chain",
            sources=["heimdall_proxy/native/_chain.c"],
            depends=["heimdall_proxy/native/_chain.h"],
            # the runtime library by its soname: no -dev package (header, .so link) needed
            extra_link_args=["-l:libxxhash.so.0"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "heimdall_proxy.native._tokens",
            sources=["heimdall_proxy/native/_tokens.c"],
            depends=["heimdall_proxy/native/_msgpack.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "heimdall_proxy.native._u64map",
            sources=["heimdall_proxy/native/_u64map.c"],
            depends=["heimdall_proxy/native/_u64map.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "heimdall_proxy.native._vllm_ingest",
            sources=["heimdall_proxy/native/_vllm_ingest.c"],
            depends=[
                "heimdall_proxy/native/_u64map.h",
                "heimdall_proxy/native/_chain.h",
                "heimdall_proxy/native/_msgpack.h",
            ],
            extra_link_args=["-l:libxxhash.so.0"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
