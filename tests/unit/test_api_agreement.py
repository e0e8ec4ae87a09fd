"""The models (`poolpilot validate`), the CRD as the API server applies it, and the CLI agree on
every document and file, hostile ones included (generated in api_fuzz from the CRD's schema).

CI runs 2,000 documents and 200 files; docs/api.md has the fuzz command for 10,000 of each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_fuzz import EXAMPLES, FILE_EXAMPLES, Tally, check_document, check_file, documents, files
from hypothesis import HealthCheck, given, settings

SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def document_tally() -> Iterator[Tally]:
    tally = Tally(Counter())
    yield tally
    print("\n" + tally.line("documents"))
    # Not vacuous: both verdicts are common, so the property compares real decisions.
    assert tally.counts["accepted"] >= tally.counts["examples"] // 20, tally.line("documents")
    assert tally.counts["refused"] >= tally.counts["examples"] // 20, tally.line("documents")


@pytest.fixture(scope="module")
def file_tally(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Tally]]:
    tally = Tally(Counter())
    yield tmp_path_factory.mktemp("fuzz") / "pool.yaml", tally
    print("\n" + tally.line("files"))


@settings(max_examples=EXAMPLES, **SETTINGS)  # type: ignore[arg-type]
@given(doc=documents())
def test_models_and_crd_agree(doc: dict[str, Any], document_tally: Tally) -> None:
    check_document(doc, document_tally)


@settings(max_examples=FILE_EXAMPLES, **SETTINGS)  # type: ignore[arg-type]
@given(data=files())
def test_files_never_crash_validate_or_render(data: bytes,
                                              file_tally: tuple[Path, Tally]) -> None:
    path, tally = file_tally
    check_file(path, data, tally)
