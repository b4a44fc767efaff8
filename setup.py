"""The one compiled part: kvcache/_chain.c, the XXH3 rolling block keys (kvcache.hashing).

Everything else is in pyproject.toml. The extension links the system's libxxhash (Debian's
libxxhash0, which apt itself depends on); it is optional: where it cannot be built, the
install goes on and kvcache.hashing uses its Python loop (slower, same keys)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "heimdall_proxy.kvcache._chain",
            sources=["heimdall_proxy/kvcache/_chain.c"],
            # the runtime library by its soname: no -dev package (header, .so link) needed
            extra_link_args=["-l:libxxhash.so.0"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
