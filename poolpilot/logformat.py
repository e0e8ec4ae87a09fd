"""Log lines as text (for people) or JSON (for log pipelines: Loki, Elasticsearch, Cloud Logging).

JSON: one object per line with `time` (RFC 3339, UTC), `level`, `logger`, `message`, the
exception's traceback as `exception` when there is one, and any `extra={...}` fields the call
passed (a decision's inputs, a pool's name), so they can be filtered on without parsing text.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
FORMATS = ("text", "json")
# What every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        return json.dumps(out, default=str)


def configure(level: str, fmt: str, stream: Any) -> None:
    """As logging.basicConfig: does nothing when the root logger has handlers already."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
