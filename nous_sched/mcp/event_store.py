"""A small, bounded, in-memory event store for Streamable HTTP (SEP-1699).

With an event store the SDK's session manager starts every POST SSE stream
with a priming event that has an id (and, with ``retry_interval``, a
``retry`` field), so a client whose stream drops can reconnect with
``Last-Event-ID`` and get the rest. :class:`BoundedEventStore` keeps at most
``max_events`` events over at most ``max_streams`` streams, evicting the
oldest first; a client that asks to resume from an evicted event gets
nothing replayed (``None``), as for an unknown id.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Optional

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["BoundedEventStore"]


class BoundedEventStore(EventStore):
    """At most ``max_events`` events and ``max_streams`` streams, oldest evicted first.

    Only the server's event loop touches it (the SDK awaits its methods there),
    so it needs no lock.
    """

    def __init__(self, max_events: int = 10_000, max_streams: int = 1_000) -> None:
        self.max_events = max_events
        self.max_streams = max_streams
        self._ids = itertools.count(1)
        self._events: OrderedDict[EventId, tuple[StreamId, Optional[JSONRPCMessage]]] = OrderedDict()
        self._streams: OrderedDict[StreamId, None] = OrderedDict()

    async def store_event(self, stream_id: StreamId, message: Optional[JSONRPCMessage]) -> EventId:
        event_id = str(next(self._ids))
        self._events[event_id] = (stream_id, message)
        self._streams[stream_id] = None
        self._streams.move_to_end(stream_id)
        while len(self._streams) > self.max_streams:
            gone, _ = self._streams.popitem(last=False)
            for key in [k for k, (s, _) in self._events.items() if s == gone]:
                del self._events[key]
        while len(self._events) > self.max_events:
            self._events.popitem(last=False)
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> Optional[StreamId]:
        found = self._events.get(last_event_id)
        if found is None:
            return None
        stream_id = found[0]
        after = False
        for event_id, (stream, message) in list(self._events.items()):
            if after and stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id
