"""The optional pre-pull DaemonSet: off by default; on, it keeps the runtime image (and any
extra ones) pulled on the nodes its nodeSelector and tolerations pick, asking for no GPU."""

from __future__ import annotations

from pathlib import Path

from chartlib import by_kind, one, render

from poolpilot import api


def test_off_by_default(tmp_path: Path) -> None:
    assert not by_kind(render({}, tmp=tmp_path), "DaemonSet")


def test_on_it_pulls_the_runtime_image_where_the_engines_run(tmp_path: Path) -> None:
    gpu = {"nvidia.com/gpu.present": "true"}
    taint = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    objs = render({"prepull": {"enabled": True, "nodeSelector": gpu, "tolerations": taint,
                               "extraImages": ["registry.example.com/ml/runtime:2.0"]}},
                  tmp=tmp_path)
    ds = one(objs, "DaemonSet", "-prepull")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == gpu and pod["tolerations"] == taint
    first, extra = pod["containers"]
    # The image the operator gives engines by default.
    assert first["image"] == api.DEFAULT_RUNTIME_IMAGE
    assert extra["image"] == "registry.example.com/ml/runtime:2.0"
    for c in pod["containers"]:
        assert c["command"] == ["sleep", "infinity"]
        assert "nvidia.com/gpu" not in str(c["resources"])
        assert c["resources"]["requests"] == {"cpu": "1m", "memory": "16Mi"}
    assert pod["automountServiceAccountToken"] is False


def test_a_registry_mirror_and_a_digest_apply(tmp_path: Path) -> None:
    digest = "sha256:" + "a" * 64
    objs = render({"global": {"imageRegistry": "mirror.internal:5000"},
                   "prepull": {"enabled": True, "image": {"digest": digest}}}, tmp=tmp_path)
    (container,) = one(objs, "DaemonSet", "-prepull")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"mirror.internal:5000/poolpilot/runtime@{digest}"
