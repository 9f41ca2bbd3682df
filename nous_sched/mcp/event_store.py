"""The SSE event store of serve-mcp's Streamable HTTP: priming events, and no replay.

With an event store the SDK starts every POST SSE stream with a *priming
event* (an id and empty data) and, with a ``retry_interval``, a ``retry``
field, as the spec's SEP-1699 asks. :class:`PrimingEventStore` gives each
event a random id and keeps nothing: a client that reconnects with
``Last-Event-ID`` gets nothing replayed (as for an id the server forgot), and
the store uses no memory.

Why no replay: the SDK (2.3.0) gives one store to every session and names
each POST's stream by its JSON-RPC request id, which every client numbers
from 1. A store that replays would hand one client, reconnecting with the id
of its own priming event, the events other sessions stored later on a
stream of the same number: their ``run_code`` results
(``tests/test_serve_live.py`` shows it cannot happen here).
"""

from __future__ import annotations

import secrets
from typing import Optional

from mcp.server.streamable_http import EventCallback, EventId, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["PrimingEventStore"]


class PrimingEventStore(EventStore):
    """Random event ids, nothing kept, nothing replayed (see the module docstring).

    No ``__len__``: the SDK tests the store for truth (``if not event_store``).
    """

    async def store_event(self, stream_id: StreamId, message: Optional[JSONRPCMessage]) -> EventId:
        return secrets.token_urlsafe(12)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> Optional[StreamId]:
        return None
