"""Cancel a request's work when its HTTP client goes away.

Starlette does not stop a route when the client disconnects: a bulk request abandoned by its
client would still occupy the replicas' queues. This pure ASGI middleware, once a request's body
has been read in full, listens for ``http.disconnect`` and cancels the request's task. The cancellation reaches the replicas as cancelled gRPC calls, and their schedulers drop the
sequences that have not run yet (server counter ``cancelled_sequences``).

What it does not own: which work is cancelled (whatever the route awaits), error replies (there
is no one left to answer). Once a response has started it is never cancelled, and a route that
itself waits for ``http.disconnect`` (streaming) gets the same message.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, MutableMapping

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class CancelOnDisconnect:
    """ASGI middleware: an HTTP request's handler is cancelled when its client disconnects.

    The handler runs in the request's own task (no task per request for it: that cost showed in
    the gateway's per-request CPU); a watcher task, started once the body has been read, cancels
    that task when ``http.disconnect`` arrives before the response has started.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        disconnected: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        state = {"started": False, "finished": False, "cancelled": False}
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    if not disconnected.done():
                        disconnected.set_result(msg)
                    if not state["started"] and not state["finished"]:
                        state["cancelled"] = True  # the client is gone and nobody will read the answer
                        task.cancel()
                    return

        async def wrapped_receive() -> Message:
            nonlocal watcher
            if watcher is not None:
                return await asyncio.shield(disconnected)  # the watcher owns the real receive now
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if not disconnected.done():
                    disconnected.set_result(msg)
            elif not msg.get("more_body", False):
                watcher = asyncio.ensure_future(watch())
            return msg

        async def wrapped_send(msg: Message) -> None:
            # Once the answer is on its way (or streaming) the app finishes on its own.
            state["started"] = True
            await send(msg)

        try:
            await self.app(scope, wrapped_receive, wrapped_send)
        except asyncio.CancelledError:
            if not state["cancelled"]:
                raise
            task.uncancel()
        finally:
            state["finished"] = True
            if watcher is not None:
                watcher.cancel()
