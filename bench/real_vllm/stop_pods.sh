#!/usr/bin/env bash
# Stop pods started by start_pods.sh: SIGTERM to each pod's process group, SIGKILL after a grace
# period. With names (vllm-0 ...) only those; without, every RUN_DIR/*.pid.
#
#   bash bench/real_vllm/stop_pods.sh [NAME ...]
#
# Environment: RUN_DIR (default bench/real_vllm/.run), VLLM_STOP_GRACE (seconds, default 20).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RUN_DIR="${RUN_DIR:-$HERE/.run}"
GRACE="${VLLM_STOP_GRACE:-20}"

pidfiles=()
if [ $# -gt 0 ]; then
    for name in "$@"; do pidfiles+=("$RUN_DIR/$name.pid"); done
else
    shopt -s nullglob
    pidfiles=("$RUN_DIR"/*.pid)
fi

alive() { kill -0 "-$1" 2>/dev/null; }

pgids=()
for f in "${pidfiles[@]}"; do
    [ -f "$f" ] || continue
    pgid="$(cat "$f")"
    # The pid file holds the setsid'd leader: its process group is the whole pod.
    if [[ "$pgid" =~ ^[0-9]+$ ]] && alive "$pgid"; then
        kill -TERM "-$pgid" 2>/dev/null && pgids+=("$pgid")
        echo "stopping $(basename "$f" .pid) (pgid $pgid)"
    fi
    rm -f "$f"
done

deadline=$((SECONDS + GRACE))
for pgid in "${pgids[@]+"${pgids[@]}"}"; do
    while alive "$pgid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
    if alive "$pgid"; then
        echo "pgid $pgid still running after ${GRACE}s: SIGKILL"
        kill -KILL "-$pgid" 2>/dev/null
    fi
done
exit 0
