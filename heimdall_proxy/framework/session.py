"""A request's session id, as session-id-producer publishes it on the CycleState for the
session-affinity filter and scorer (llm-d's attribute/session)."""

from __future__ import annotations

from heimdall_proxy.framework.attributes import data_key

SESSION_ID_PRODUCER_TYPE = "session-id-producer"
#: The attribute's name, as llm-d spells it (a session source names it as `attribute`).
SESSION_ID_ATTRIBUTE = "SessionIDDataKey"


def session_id_key(producer_name: str = "") -> str:
    """Where the session-id-producer called `producer_name` (default: its type name, the
    name of an unnamed instance) publishes."""
    return data_key(SESSION_ID_ATTRIBUTE, producer_name or SESSION_ID_PRODUCER_TYPE)
