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
    the gateway's per-request CPU); a watcher task cancels that task when ``http.disconnect``
    arrives before the response has started. The watcher starts ``watch_after_s`` after the body
    has been read, and only if the request is still running then: most small requests finish
    sooner and never pay for a task (a client gone meanwhile is noticed as soon as it starts,
    since the server keeps the disconnect for the next ``receive``).
    """

    def __init__(self, app: ASGIApp, watch_after_s: float = 0.02) -> None:
        self.app, self.watch_after_s = app, watch_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        disconnected: asyncio.Future[Message] = loop.create_future()
        state = {"started": False, "finished": False, "cancelled": False}
        watcher: asyncio.Task[None] | None = None
        timer: asyncio.TimerHandle | None = None
        body_read = False

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

        def start_watcher(always: bool = False) -> None:
            nonlocal watcher
            if watcher is None and not disconnected.done() and (always or not (state["started"] or state["finished"])):
                watcher = asyncio.ensure_future(watch())

        async def wrapped_receive() -> Message:
            nonlocal timer, body_read
            if body_read:
                start_watcher(always=True)  # the app waits for the disconnect itself (streaming): the watcher owns receive now
                return await asyncio.shield(disconnected)
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if not disconnected.done():
                    disconnected.set_result(msg)
            elif not msg.get("more_body", False):
                body_read = True
                timer = loop.call_later(self.watch_after_s, start_watcher)
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
            if timer is not None:
                timer.cancel()
            if watcher is not None:
                watcher.cancel()
