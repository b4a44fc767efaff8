"""Many pods' KV-event publishers in one process: a fleet for scale tests and benches.

A gateway following 1,024 pods needs 1,024 real publishers, and one process cannot hold
them all beside the gateway without sharing its descriptor count; a few of these processes
can (`python -m heimdall_proxy.sim.kvfleet --pods 128 --first 0`). Each pod is a
`KVEventPublisher` (vLLM's wire format, a PUB socket and a replay ROUTER on random ports).
Half the pods name themselves in the topic by pod name (`kv@fleet-<i>@<model>`), the other
half by their publisher's `host:port`, as llm-d's `kv@${POD_IP}@<model>` does per host.

Protocol on stdin/stdout, one line each: the fleet prints a JSON list of
`{"name", "endpoint", "replay"}` once bound; then `store <k>` makes every pod publish k BlockStored
batches (pod i's batch j stores one block of tokens `[i, j, 0...]`, engine hash
`block_hash(i, j)`) and prints `stored`; `quit` (or the end of stdin) closes the fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from heimdall_proxy.sim.kvevents import GPU, BlockStored, KVEventPublisher

BLOCK = 16
MODEL = "fleet-model"


def pod_name(i: int) -> str:
    return f"fleet-{i}"


def block_tokens(i: int, j: int) -> list[int]:
    """The tokens of pod i's j-th block: unique per (pod, batch)."""
    return [i, j] + [0] * (BLOCK - 2)


def block_hash(i: int, j: int) -> int:
    return (i << 32) | (j + 1)


async def run(first: int, pods: int, host: str, replay: bool) -> None:
    publishers: list[KVEventPublisher] = []
    try:
        for i in range(first, first + pods):
            pub = KVEventPublisher(host, -1, None if replay else 0, "")
            topic = f"kv@{pod_name(i)}@{MODEL}" if i % 2 == 0 else f"kv@{host}:{pub.port}@{MODEL}"
            pub.set_topic(topic)
            pub.start()
            publishers.append(pub)
        listing = [
            {"name": pod_name(first + k), "endpoint": p.endpoint, "replay": p.replay_endpoint}
            for k, p in enumerate(publishers)
        ]
        print(json.dumps(listing), flush=True)
        loop = asyncio.get_running_loop()
        sent = 0
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                return
            if line[0] == "store":
                for _ in range(int(line[1])):
                    for k, pub in enumerate(publishers):
                        i = first + k
                        tokens = block_tokens(i, sent)
                        event = BlockStored([block_hash(i, sent)], None, tokens, BLOCK, None,
                                            GPU, None)  # fmt: skip
                        pub.publish([event])
                    sent += 1
                    await asyncio.sleep(0)  # let the replay sockets answer meanwhile
                print("stored", flush=True)
    finally:
        for pub in publishers:
            await pub.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=128)
    ap.add_argument("--first", type=int, default=0, help="index of this fleet's first pod")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--no-replay", action="store_true", help="no replay ROUTER sockets")
    args = ap.parse_args(argv)
    asyncio.run(run(args.first, args.pods, args.host, not args.no_replay))


if __name__ == "__main__":
    main()
