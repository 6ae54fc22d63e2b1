"""pgqueue: send jobs to, and work them off, pgqueue queues in PostgreSQL.

Sync API here; its asyncio twin is `pgqueue.aio`. Logs go to the `pgqueue` logger.
"""

from .messages import Message, OnTimeout, Park, error_text
from .producer import GraphRow, Outcome, ParentFailure, Producer, graph, park, result, send, send_batch, signal
from .worker import Worker

__all__ = [
    "GraphRow",
    "Message",
    "OnTimeout",
    "Outcome",
    "ParentFailure",
    "Park",
    "Producer",
    "Worker",
    "error_text",
    "graph",
    "park",
    "result",
    "send",
    "send_batch",
    "signal",
]
__version__ = "0.5.0"
