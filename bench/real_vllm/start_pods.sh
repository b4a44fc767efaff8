#!/usr/bin/env bash
# Start N vLLM CPU pods serving the tiny model, wait until each answers /health.
#
#   bash bench/real_vllm/start_pods.sh N [BASE_PORT] [-- extra vllm serve args]
#
# Pod i (0-based) is named vllm-i and listens on 127.0.0.1:BASE_PORT+i (BASE_PORT default 18100).
# Its KV events go out on a ZMQ PUB socket at port KV_BASE_PORT+2i, with the replay ROUTER
# socket on the next port (KV_BASE_PORT default BASE_PORT+1000), topic kv@vllm-i@MODEL.
# Prefix caching on, --block-size 32 (the CPU attention backend needs a multiple of 32),
# --enforce-eager (no torch.compile: startup stays near a minute).
#
# Every pod is its own process group (setsid); its pid, log and endpoints go into RUN_DIR:
#   RUN_DIR/vllm-i.pid   process-group id for stop_pods.sh
#   RUN_DIR/vllm-i.log   the pod's output
#   RUN_DIR/pods.tsv     name, http url, kv events endpoint, replay endpoint, topic (one a line)
# On a failed start every pod this run started is stopped again and the exit code is 1.
#
# Environment:
#   VLLM_VENV (default <repo>/.venv-vllm), VLLM_MODEL_DIR (default bench/real_vllm/.model/tiny-llama),
#   VLLM_MODEL_NAME (served name, default tiny-llama), RUN_DIR (default bench/real_vllm/.run),
#   KV_BASE_PORT, VLLM_START_TIMEOUT (seconds, default 300),
#   OMP_NUM_THREADS (default 1 per pod), VLLM_CPU_OMP_THREADS_BIND (default nobind): the
#   machine is shared, so a pod takes one thread and no core of its own;
#   VLLM_CPU_KVCACHE_SPACE (GiB, default 1), VLLM_MAX_PODS (default 2).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

usage() { echo "usage: $0 N [BASE_PORT] [-- extra vllm serve args]" >&2; exit 2; }
[ $# -ge 1 ] || usage
N="$1"; shift
BASE_PORT=18100
if [ $# -ge 1 ] && [ "$1" != "--" ]; then BASE_PORT="$1"; shift; fi
EXTRA=()
if [ $# -ge 1 ]; then
    [ "$1" = "--" ] || usage
    shift
    EXTRA=("$@")
fi
[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] || usage
[[ "$BASE_PORT" =~ ^[0-9]+$ ]] || usage
MAX_PODS="${VLLM_MAX_PODS:-2}"
if [ "$N" -gt "$MAX_PODS" ]; then
    echo "refusing to start $N pods on a shared 2-core machine (VLLM_MAX_PODS=$MAX_PODS)" >&2
    exit 2
fi

VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
MODEL_DIR="${VLLM_MODEL_DIR:-$HERE/.model/tiny-llama}"
MODEL_NAME="${VLLM_MODEL_NAME:-tiny-llama}"
RUN_DIR="${RUN_DIR:-$HERE/.run}"
KV_BASE_PORT="${KV_BASE_PORT:-$((BASE_PORT + 1000))}"
TIMEOUT="${VLLM_START_TIMEOUT:-300}"

if [ ! -x "$VENV/bin/vllm" ]; then
    echo "no vLLM in $VENV: run bash bench/real_vllm/setup.sh first" >&2
    exit 1
fi
if [ ! -f "$MODEL_DIR/config.json" ]; then
    echo "no model in $MODEL_DIR: run bash bench/real_vllm/setup.sh first" >&2
    exit 1
fi
mkdir -p "$RUN_DIR"

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

started=()
fail() {
    echo "start_pods: $*" >&2
    for name in "${started[@]}"; do
        if [ -f "$RUN_DIR/$name.log" ]; then
            echo "---- last lines of $RUN_DIR/$name.log" >&2
            tail -n 25 "$RUN_DIR/$name.log" >&2
        fi
    done
    RUN_DIR="$RUN_DIR" bash "$HERE/stop_pods.sh" "${started[@]}" >&2 || true
    exit 1
}

: >"$RUN_DIR/pods.tsv"
for ((i = 0; i < N; i++)); do
    name="vllm-$i"
    port=$((BASE_PORT + i))
    kv=$((KV_BASE_PORT + 2 * i))
    replay=$((kv + 1))
    topic="kv@$name@$MODEL_NAME"
    for p in "$port" "$kv" "$replay"; do
        port_busy "$p" && fail "port $p is already in use"
    done
    if [ -f "$RUN_DIR/$name.pid" ] && kill -0 "-$(cat "$RUN_DIR/$name.pid")" 2>/dev/null; then
        fail "$name is already running (pgid $(cat "$RUN_DIR/$name.pid")); stop_pods.sh first"
    fi
    events=$(printf '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:%d", "replay_endpoint": "tcp://*:%d", "topic": "%s"}' "$kv" "$replay" "$topic")
    # setsid: the pod's API server, engine core and worker share one process group to stop.
    VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
    VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}" \
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    PYTHONUNBUFFERED=1 \
        setsid "$VENV/bin/vllm" serve "$MODEL_DIR" \
        --served-model-name "$MODEL_NAME" \
        --host 127.0.0.1 --port "$port" \
        --enforce-eager --enable-prefix-caching --block-size 32 \
        --kv-events-config "$events" \
        ${EXTRA[@]+"${EXTRA[@]}"} \
        </dev/null >"$RUN_DIR/$name.log" 2>&1 &
    echo $! >"$RUN_DIR/$name.pid"
    started+=("$name")
    printf '%s\thttp://127.0.0.1:%d\ttcp://127.0.0.1:%d\ttcp://127.0.0.1:%d\t%s\n' \
        "$name" "$port" "$kv" "$replay" "$topic" >>"$RUN_DIR/pods.tsv"
    echo "started $name: http://127.0.0.1:$port, kv events tcp://127.0.0.1:$kv (replay $replay), log $RUN_DIR/$name.log"
done

t0=$SECONDS
for ((i = 0; i < N; i++)); do
    name="vllm-$i"
    port=$((BASE_PORT + i))
    pid="$(cat "$RUN_DIR/$name.pid")"
    until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
        kill -0 "$pid" 2>/dev/null || fail "$name exited during startup"
        [ $((SECONDS - t0)) -lt "$TIMEOUT" ] || fail "$name not healthy after ${TIMEOUT}s"
        sleep 1
    done
    echo "$name healthy after $((SECONDS - t0))s"
done
