"""pgqueue: send jobs to, and work them off, pgqueue queues in PostgreSQL.

Sync API here; its asyncio twin is `pgqueue.aio`. Logs go to the `pgqueue` logger.
"""

from .messages import Message, error_text
from .producer import GraphRow, Outcome, ParentFailure, Producer, graph, result, send, send_batch
from .worker import Worker

__all__ = [
    "GraphRow",
    "Message",
    "Outcome",
    "ParentFailure",
    "Producer",
    "Worker",
    "error_text",
    "graph",
    "result",
    "send",
    "send_batch",
]
__version__ = "0.5.0"
