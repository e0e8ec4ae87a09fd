"""Multi-node replicas in the launcher: one vLLM engine spread over the pods of a LeaderWorkerSet
group (`poolpilot launch --nodes N`, every pod of the group runs the same command).

vLLM runs across nodes with its multiprocessing executor (no Ray cluster to bootstrap): every
node starts vLLM with `--nnodes N --node-rank R --master-addr LEADER`; rank 0 (the leader) runs
the OpenAI server, the others run `vllm serve --headless` (engine workers only, no API server)
and join the leader's torch.distributed group at LEADER:29501 (vLLM's --master-port default).
The LeaderWorkerSet controller tells each pod who it is: LWS_LEADER_ADDRESS (the leader's DNS
name), LWS_GROUP_SIZE and LWS_WORKER_INDEX (0 on the leader).

Parallelism across the group: `--tensor-parallel` ranks per pod, times N pods, is the engine's
world size. By default the group is N pipeline stages of tensor-parallel-per-pod each (tensor
parallel stays on a node's NVLink, only activations cross nodes); `--engine-arg
pipelineParallelSize=P` divides the world differently (P=1: tensor parallel across all pods,
for fast inter-node networks). Pure apart from `group_member` reading the environment it is
given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poolpilot import leaderworkerset as lws

# The vLLM flags this module sets (refused as --engine-arg: they come from the group).
NODE_FLAGS = {
    "nnodes": "--nodes",
    "node-rank": "--nodes (the pod's LWS_WORKER_INDEX)",
    "master-addr": "--nodes (the group's LWS_LEADER_ADDRESS)",
    "headless": "--nodes (every pod but the leader runs headless)",
}
PIPELINE_FLAG = "pipeline-parallel-size"
# `vllm serve` (the CLI) has --headless; the api_server module the leader runs does not.
CLI_MODULE = "vllm.entrypoints.cli.main"


class GroupError(ValueError):
    """The pod is not in the group its --nodes says; the message names the variable or option."""


@dataclass(frozen=True)
class GroupMember:
    nodes: int  # pods in the group (--nodes, LWS_GROUP_SIZE)
    rank: int  # this pod's index, 0 = the leader
    leader: str  # the leader's address

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def group_member(nodes: int, env: Mapping[str, str]) -> GroupMember | None:
    """Who this pod is in its group, from the LWS environment; None for a single-pod replica."""
    if nodes < 1:
        raise GroupError(f"--nodes {nodes}: must be >= 1")
    if nodes == 1:
        return None
    missing = [v for v in (lws.LEADER_ADDRESS_ENV, lws.WORKER_INDEX_ENV) if not env.get(v)]
    if missing:
        raise GroupError(f"--nodes {nodes}: {' and '.join(missing)} not set; a multi-node "
                         "replica runs in a LeaderWorkerSet group, whose controller sets them")
    size = env.get(lws.GROUP_SIZE_ENV)
    if size is not None and size.strip() != str(nodes):
        raise GroupError(f"--nodes {nodes}: the group has {lws.GROUP_SIZE_ENV}={size} pods; "
                         "the LeaderWorkerSet's size and --nodes must agree")
    raw = env[lws.WORKER_INDEX_ENV]
    try:
        rank = int(raw)
    except ValueError:
        raise GroupError(f"{lws.WORKER_INDEX_ENV}={raw!r}: not an integer") from None
    if not 0 <= rank < nodes:
        raise GroupError(f"{lws.WORKER_INDEX_ENV}={rank}: must be within 0..{nodes - 1} "
                         f"(--nodes {nodes})")
    return GroupMember(nodes=nodes, rank=rank, leader=env[lws.LEADER_ADDRESS_ENV])


def parallel_sizes(tensor_per_pod: int, nodes: int, pipeline: int | None) -> tuple[int, int]:
    """(tensor_parallel_size, pipeline_parallel_size) for the whole group: N pipeline stages by
    default, or the pipeline size asked for with the rest as tensor parallel."""
    world = tensor_per_pod * nodes
    pp = nodes if pipeline is None else pipeline
    if pp < 1 or world % pp:
        raise GroupError(
            f"--engine-arg pipelineParallelSize={pp}: must divide the group's {world} ranks "
            f"(--tensor-parallel {tensor_per_pod} x --nodes {nodes}); e.g. {nodes} (pipeline "
            "across the pods, the default) or 1 (tensor parallel across them)")
    return world // pp, pp


def _pipeline_arg(engine_args: Sequence[str]) -> int | None:
    for pair in engine_args:
        key, _, raw = pair.partition("=")
        if key.strip().lstrip("-").replace("_", "-").lower() in (
                PIPELINE_FLAG, PIPELINE_FLAG.replace("-", "")):
            try:
                return int(raw)
            except ValueError:
                raise GroupError(f"--engine-arg {pair}: must be an integer") from None
    return None


def _without(cmd: list[str], flag: str) -> list[str]:
    """The command without `flag VALUE`."""
    out: list[str] = []
    skip = False
    for i, part in enumerate(cmd):
        if skip:
            skip = False
            continue
        if part == flag and i + 1 < len(cmd):
            skip = True
            continue
        out.append(part)
    return out


def group_command(cmd: list[str], member: GroupMember, tensor_per_pod: int,
                  engine_args: Sequence[str], server_module: str) -> list[str]:
    """A single-pod vLLM command (`python -m SERVER_MODULE --model M ...`) turned into this
    pod's part of the group: the group's parallel sizes and node flags; workers headless."""
    tp, pp = parallel_sizes(tensor_per_pod, member.nodes, _pipeline_arg(engine_args))
    out = _without(cmd, "--tensor-parallel-size")
    node = ["--tensor-parallel-size", str(tp)]
    if _pipeline_arg(engine_args) is None:  # else the --engine-arg flag already says it
        node += [f"--{PIPELINE_FLAG}", str(pp)]
    node += ["--nnodes", str(member.nodes), "--node-rank", str(member.rank),
             "--master-addr", member.leader]
    if not member.is_leader:
        module = out.index(server_module)
        out[module:module + 1] = [CLI_MODULE, "serve"]
        node.append("--headless")
    # after `--model M` (or `--model=M`, for a model that starts with '-')
    model = next(i for i, part in enumerate(out) if part.split("=")[0] == "--model")
    model += 2 if out[model] == "--model" else 1
    return out[:model] + node + out[model:]
