"""How long the operator waits after an API error: transient soon, permanent doubling."""

from __future__ import annotations

import pytest
from poolpilot.operator import retry


@pytest.mark.parametrize("transient,failures,want", [
    (True, 1, 2.0), (True, 9, 2.0),
    (False, 1, 5.0), (False, 2, 10.0), (False, 3, 20.0), (False, 7, 300.0), (False, 5000, 300.0),
], ids=["transient-1", "transient-9", "permanent-1", "permanent-2", "permanent-3",
        "permanent-capped", "permanent-no-overflow"])
def test_delay(transient: bool, failures: int, want: float) -> None:
    assert retry.delay(transient=transient, failures=failures) == want


def test_delay_with_a_shorter_first_wait() -> None:
    assert [retry.delay(transient=False, failures=n, first=0.5, ceiling=3)
            for n in range(1, 6)] == [0.5, 1, 2, 3, 3]
