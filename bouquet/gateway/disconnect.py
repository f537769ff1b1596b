"""Cancel a request's work when its HTTP client goes away.

Starlette does not stop a route when the client disconnects: a bulk request abandoned by its
client would still occupy the replicas' queues. This pure ASGI middleware runs each HTTP request
as a task; once the body has been read in full it listens for ``http.disconnect`` and cancels the
task. The cancellation reaches the replicas as cancelled gRPC calls, and their schedulers drop the
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
    """ASGI middleware: an HTTP request's handler is cancelled when its client disconnects."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        disconnected: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        body_done = asyncio.Event()

        async def wrapped_receive() -> Message:
            if body_done.is_set():
                return await asyncio.shield(disconnected)  # the watcher owns the real receive now
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if not disconnected.done():
                    disconnected.set_result(msg)
            elif not msg.get("more_body", False):
                body_done.set()
            return msg

        async def watch() -> None:
            await body_done.wait()
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    if not disconnected.done():
                        disconnected.set_result(msg)
                    return

        started = False

        async def wrapped_send(msg: Message) -> None:
            nonlocal started
            started = True
            await send(msg)

        handler = asyncio.ensure_future(self.app(scope, wrapped_receive, wrapped_send))
        watcher = asyncio.ensure_future(watch())
        try:
            while not handler.done():
                await asyncio.wait({handler, disconnected}, return_when=asyncio.FIRST_COMPLETED)
                if disconnected.done() and not handler.done():
                    if started:
                        # The answer is on its way (or streaming, or running background tasks):
                        # let the app finish on its own.
                        await handler
                        break
                    handler.cancel()  # the client is gone and nobody will read the answer
                    try:
                        await handler
                    except asyncio.CancelledError:
                        pass
                    return
        except asyncio.CancelledError:
            handler.cancel()
            raise
        finally:
            watcher.cancel()
        handler.result()  # re-raise what the app raised, as a plain call would
