"""A local Ray cluster of three nodes for the ray runner's tests, started once per module.

The cluster runs in a process of its own (`python tests/integration/ray_cluster.py`), so that Ray stays
out of the test worker's memory (every git spawn through `sh` forks the whole worker) and a test can
remove a node while a round runs: the fixture writes `remove NAME` on its stdin and waits for
`removed NAME`. Each node offers its check slots (`lanes_es_slots`) and a custom resource naming it
(`lanes_es_node_NAME`), so a test can tell where work ran.

Bound to 127.0.0.2, a loopback address: Ray rewrites 127.0.0.1 and localhost, wherever an address is
given to it, to the machine's outward address (its Ray Client server and every driver then dial an
address nothing listens on); any other loopback address is taken as it is. Token authentication is on
(a fresh token per cluster, in RAY_AUTH_TOKEN), as lanes-es requires it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

HOST = "127.0.0.2"
NODES = ("a", "b", "c")
SLOTS_PER_NODE = 12
START_SECONDS = 180


@dataclass
class LocalRayCluster:
    runner: str  # ray://HOST:PORT, what --runner takes
    token: str
    process: subprocess.Popen[str]
    nodes: dict[str, str]  # name -> node id

    def env(self) -> dict[str, str]:
        """What a coordinator of this cluster needs in its environment."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def remove_node(self, name: str) -> None:
        """Kill every process of node `name` (not the head), as a machine that is switched off."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"remove {name}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer == f"removed {name}", answer


@contextmanager
def local_ray_cluster(nodes: tuple[str, ...] = NODES, slots: int = SLOTS_PER_NODE,
                      node_env: dict[str, str] | None = None) -> Iterator[LocalRayCluster]:
    """The cluster; `node_env`: what the nodes' own environment adds (what an agent finds there, as on a
    real machine: its credentials, a fake agent's scenario)."""
    token = secrets.token_hex(24)
    env = {**os.environ, **(node_env or {}), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "RAY_USAGE_STATS_ENABLED": "0"}
    process = subprocess.Popen([sys.executable, __file__, ",".join(nodes), str(slots)], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the local Ray cluster did not start (exit {process.wait()})")
        started = json.loads(line)
        yield LocalRayCluster(runner=started["runner"], token=token, process=process, nodes=started["nodes"])
    finally:
        if process.stdin is not None:
            process.stdin.close()  # the cluster shuts down at the end of its input
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _serve(names: list[str], slots: int) -> None:
    """Start the cluster, print its address and nodes as one JSON line, then obey `remove NAME` lines."""
    from ray.cluster_utils import Cluster

    base = tempfile.mkdtemp(prefix="ray-")  # Ray's socket paths must stay short
    os.environ["RAY_TMPDIR"] = base  # where Ray notes the cluster's address, not the machine's /tmp/ray
    temp_dir = os.path.join(base, "ray")
    os.mkdir(temp_dir)
    port = _free_port()
    common = {"node_ip_address": HOST, "num_cpus": 0, "temp_dir": temp_dir,
              "object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "ray_client_server_port": port, "include_dashboard": False,
        "resources": {f"lanes_es_node_{names[0]}": 1, "lanes_es_slots": slots}})
    nodes = {names[0]: cluster.head_node}
    for name in names[1:]:
        nodes[name] = cluster.add_node(**common, resources={f"lanes_es_node_{name}": 1, "lanes_es_slots": slots})
    cluster.wait_for_nodes()
    print(json.dumps({"runner": f"ray://{HOST}:{port}",
                      "nodes": {name: node.node_id for name, node in nodes.items()}}), flush=True)
    try:
        for line in sys.stdin:
            command, _, name = line.strip().partition(" ")
            if command == "remove" and name in nodes and nodes[name] is not cluster.head_node:
                cluster.remove_node(nodes.pop(name), allow_graceful=False)
                print(f"removed {name}", flush=True)
            else:
                print(f"refused {line.strip()}", flush=True)
    finally:
        cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    _serve(sys.argv[1].split(","), int(sys.argv[2]))
