"""`poolpilot autoscaler`'s Prometheus access flags: what they become, and the combinations
that cannot work, each refused naming the flag."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from poolpilot.autoscaler import main as autoscaler_main
from poolpilot.autoscaler.promaccess import AccessError, FileAuth

from poolpilot import cli


def _args(*flags: str) -> argparse.Namespace:
    argv = ["autoscaler", "--prometheus", "https://prom:9091", *flags]
    return cli.build_parser(argv).parse_args(argv)


def test_flags_become_the_access(tmp_path: Path) -> None:
    for name in ("ca", "token"):
        (tmp_path / name).write_text("x")
    access = autoscaler_main.access(_args(
        "--prometheus-ca-file", str(tmp_path / "ca"),
        "--prometheus-bearer-token-file", str(tmp_path / "token"),
        "--prometheus-header", "X-Scope-OrgID: team-a",
        "--prometheus-header", "X-Extra:  two words "))
    access.check()
    assert access.headers == {"X-Scope-OrgID": "team-a", "X-Extra": "two words"}
    assert access.session().verify == str(tmp_path / "ca")
    auth = access.auth()
    assert isinstance(auth, FileAuth) and auth.value() == "Bearer x"


def test_verification_is_on_by_default() -> None:
    access = autoscaler_main.access(_args())
    access.check()
    assert access.session().verify is True and access.auth() is None


@pytest.mark.parametrize("flags,message", [
    (["--prometheus-header", "no colon"], "expected 'Name: value'"),
    (["--prometheus-ca-file", "{tmp}/missing"], "--prometheus-ca-file {tmp}/missing: no such"),
    (["--prometheus-username", "u"], "needs --prometheus-password-file"),
    (["--prometheus-cert-file", "{tmp}/f"], "needs --prometheus-key-file"),
    (["--prometheus-ca-file", "{tmp}/f", "--prometheus-insecure-skip-verify"], "choose one"),
    (["--prometheus-bearer-token-file", "{tmp}/f", "--prometheus-username", "u",
      "--prometheus-password-file", "{tmp}/f"], "choose one way to authenticate"),
    (["--prometheus-bearer-token-file", "{tmp}/f", "--prometheus-header",
      "Authorization: Bearer x"], "choose one"),
], ids=["header-syntax", "missing-file", "user-without-password", "cert-without-key",
        "ca-and-insecure", "token-and-basic", "token-and-auth-header"])
def test_contradictions_are_refused_naming_the_flag(tmp_path: Path, flags: list[str],
                                                    message: str) -> None:
    (tmp_path / "f").write_text("x")
    argv = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    with pytest.raises(AccessError) as err:
        autoscaler_main.access(_args(*argv)).check()
    assert message.replace("{tmp}", str(tmp_path)) in str(err.value)
