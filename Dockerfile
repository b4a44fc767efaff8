FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY heimdall_proxy ./heimdall_proxy
COPY config ./config
# a C compiler only while installing the C extensions (setup.py); native/_chain.c links the
# image's own libxxhash. The `kubernetes` extra: discovery.kubernetes (deploy/kubernetes).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install '.[kubernetes]' \
    && python -P -c "from heimdall_proxy.kvcache.hashing import NATIVE; assert NATIVE" \
    && python -P -c "from heimdall_proxy.kvcache.events import PACKS_TOKENS; assert PACKS_TOKENS" \
    && python -P -c "from heimdall_proxy.conductor.tables import NATIVE; assert NATIVE" \
    && python -P -c "from heimdall_proxy.conductor.native_ingest import enabled; assert enabled()" \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home heimdall

USER heimdall
EXPOSE 8000
ENTRYPOINT ["heimdall-proxy"]
# Without --config the embedded demo runs; mount a config to route to real pods:
#   docker run -v $PWD/config.yaml:/etc/heimdall/config.yaml -p 8000:8000 heimdall-proxy \
#       --config /etc/heimdall/config.yaml
CMD ["demo", "--port", "8000"]
