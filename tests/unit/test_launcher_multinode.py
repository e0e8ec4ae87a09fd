"""`poolpilot launch --nodes N`: each pod of a LeaderWorkerSet group gets its part of one vLLM
engine from the LWS environment: the leader serves the API with the group's node flags, the
workers run `vllm serve --headless`, and tensor x pipeline parallel covers every pod's GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from poolpilot.runtime import launcher, multinode
from poolpilot.runtime.launcher import LaunchError, LaunchSpec, build_command

LEADER = "llama-405b-decode-lws-0.llama-405b-decode-lws.serving"


def env(index: int, size: int = 2) -> dict[str, str]:
    return {"LWS_LEADER_ADDRESS": LEADER, "LWS_GROUP_SIZE": str(size),
            "LWS_WORKER_INDEX": str(index)}


def command(index: int, nodes: int = 2, tp: int = 8, args: tuple[str, ...] = ()) -> list[str]:
    group = multinode.group_member(nodes, env(index, nodes))
    return build_command(LaunchSpec(role="decode", model="m", tensor_parallel=tp,
                                    engine_args=list(args), group=group, python="python"))


def flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_the_leader_serves_the_api_with_the_groups_flags() -> None:
    cmd = command(0)
    assert cmd[:3] == ["python", "-m", launcher.SERVER_MODULE]
    assert (flag(cmd, "--tensor-parallel-size"), flag(cmd, "--pipeline-parallel-size")) == (
        "8", "2")
    assert (flag(cmd, "--nnodes"), flag(cmd, "--node-rank"), flag(cmd, "--master-addr")) == (
        "2", "0", LEADER)
    assert "--headless" not in cmd
    assert cmd.count("--tensor-parallel-size") == 1


def test_a_worker_runs_headless_with_its_rank() -> None:
    cmd = command(1)
    assert cmd[:4] == ["python", "-m", multinode.CLI_MODULE, "serve"]
    assert "--headless" in cmd
    assert (flag(cmd, "--node-rank"), flag(cmd, "--master-addr")) == ("1", LEADER)
    # The same engine configuration as the leader's, apart from who it is.
    leader = command(0)
    assert flag(cmd, "--kv-transfer-config") == flag(leader, "--kv-transfer-config")
    assert flag(cmd, "--model") == flag(leader, "--model") == "m"


def test_engine_args_can_make_it_tensor_parallel_across_the_pods() -> None:
    cmd = command(0, args=("pipelineParallelSize=1",))
    assert flag(cmd, "--tensor-parallel-size") == "16"
    assert flag(cmd, "--pipeline-parallel-size") == "1"
    assert cmd.count("--pipeline-parallel-size") == 1


def test_a_single_pod_replica_is_unchanged() -> None:
    assert multinode.group_member(1, {}) is None
    spec = LaunchSpec(role="decode", model="m", tensor_parallel=8, python="python")
    assert "--nnodes" not in build_command(spec)


@dataclass(frozen=True)
class Bad:
    id: str
    nodes: int
    env: dict[str, str]
    says: str


BAD = [
    Bad("no-lws-env", 2, {}, "LWS_LEADER_ADDRESS and LWS_WORKER_INDEX not set"),
    Bad("size-disagrees", 2, env(0, 4), "LWS_GROUP_SIZE=4"),
    Bad("index-out-of-range", 2, {**env(0), "LWS_WORKER_INDEX": "2"}, "within 0..1"),
    Bad("index-not-a-number", 2, {**env(0), "LWS_WORKER_INDEX": "x"}, "not an integer"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_a_pod_outside_its_group_is_refused_with_the_reason(case: Bad) -> None:
    with pytest.raises(multinode.GroupError, match=case.says):
        multinode.group_member(case.nodes, case.env)


def test_a_pipeline_size_that_does_not_divide_the_group_is_refused() -> None:
    with pytest.raises(LaunchError, match="pipelineParallelSize=3: must divide the group's 16"):
        command(0, args=("pipelineParallelSize=3",))


@pytest.mark.parametrize("arg", ["nnodes=2", "nodeRank=1", "masterAddr=x", "headless=true"])
def test_the_group_flags_are_the_launchers_own(arg: str) -> None:
    with pytest.raises(LaunchError, match="set by the launcher; use --nodes"):
        command(0, args=(arg,))


def test_the_cli_reads_the_group_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    for key, value in env(1).items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    args = parser.parse_args(["--role", "decode", "--model", "m", "--nodes", "2",
                              "--tensor-parallel", "4", "--python", "python", "--dry-run"])
    assert launcher.run(args) == 0
    out = capsys.readouterr().out
    assert "--headless" in out and "--node-rank 1" in out and "--tensor-parallel-size 4" in out
