"""pgqueue: send jobs to, and work them off, pgqueue queues in PostgreSQL.

Sync API here; its asyncio twin is `pgqueue.aio`. Logs go to the `pgqueue` logger.
"""

from .messages import Message, error_text
from .producer import Outcome, Producer, result, send, send_batch
from .worker import Worker

__all__ = ["Message", "Outcome", "Producer", "Worker", "error_text", "result", "send", "send_batch"]
__version__ = "0.5.0"
