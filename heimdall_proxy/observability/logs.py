"""Logging set-up: the package's records to stderr as JSON lines (for log shippers) or text
(on a terminal), at klog-style verbosity (framework/log.py)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

from heimdall_proxy.framework.log import V


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus any `extra=` fields."""

    _skip = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": _level_name(record.levelno),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self._skip:
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    _skip = JsonFormatter._skip

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in self._skip)
        line = f"{self.formatTime(record)} {_level_name(record.levelno):>5} {record.name}: "
        line += record.getMessage() + (f" {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _level_name(levelno: int) -> str:
    if levelno >= logging.INFO or levelno <= logging.DEBUG:
        return logging.getLevelName(levelno).lower()
    return f"v{logging.INFO - levelno}"


def setup_logging(verbosity: int = 0, fmt: str | None = "json") -> None:
    """Route the package's logs to stderr: `-v N` shows V(N) and below. `fmt` None picks
    human-readable text when stderr is a terminal and JSON lines otherwise (log shippers)."""
    if fmt is None:
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("heimdall_proxy")
    root.handlers[:] = [handler]
    root.setLevel(V(max(0, verbosity)))
    root.propagate = False
