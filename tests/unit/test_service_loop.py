"""The replica's engine loop (server/service.py ``run``) on the CPU, with an engine that behaves like a
device: ``step`` returns at once, the handle turns ready after the batch's "device time".

Checks where work happens (graph replays stepped on the event loop, other batches and waits in
helper threads, a replay with nothing else to do waited for on the loop, finished results read on
the loop), that no more than ``depth`` batches are in flight, and that every request gets its own
rows.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from bouquet.config import ServeConfig
from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.contract import EngineInfo
from bouquet.modelspec import load_spec
from bouquet.server.scheduler import Request, Scheduler
from bouquet.server.service import InferenceService

DIM = 4


@dataclass
class Handle:
    rows: np.ndarray
    done_at: float
    waited_on: list[int] = field(default_factory=list)

    def ready(self) -> bool:
        return time.perf_counter() >= self.done_at

    def wait(self) -> np.ndarray:
        self.waited_on.append(threading.get_ident())
        left = self.done_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return self.rows


class DeviceLikeEngine:
    """Batches of at most ``graph_tokens`` tokens are "graph replays"; device time per batch is
    ``seconds(batch)``. Row i of a batch = [first token id of sequence i, 0, 0, 0]. Implements
    ``bouquet.engine.runtime.contract.StepEngine`` (tests/integration/test_contracts.py checks the real engines)."""

    inline_step = False

    def __init__(self, graph_tokens: int, seconds) -> None:  # type: ignore[no-untyped-def]
        self.graph_tokens, self.seconds = graph_tokens, seconds
        self.spec, self.out_dim = load_spec(None), DIM
        self.info = EngineInfo("fake", "float32", "none", DIM, 0.0)
        self.steps: list[tuple[int, int, float, Handle]] = []  # (thread, tokens, launch time, handle)
        self._device_free_at = 0.0
        self.graph_captures = self.graph_replays = 0

    def replays(self, batch: Batch) -> bool:
        return batch.num_tokens <= self.graph_tokens

    def warmup(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def step(self, batch: Batch) -> Handle:
        now = time.perf_counter()
        start = max(now, self._device_free_at)  # one stream: batches run back to back
        self._device_free_at = start + self.seconds(batch)
        firsts = batch.input_ids[batch.cu_seqlens[:-1]].astype(np.float32)
        rows = np.zeros((batch.num_seqs, DIM), np.float32)
        rows[:, 0] = firsts
        h = Handle(rows, self._device_free_at)
        self.graph_replays += self.replays(batch)
        self.steps.append((threading.get_ident(), batch.num_tokens, now, h))
        return h


def request(first_ids: list[int], length: int) -> Request:
    return Request([np.full(length, f, np.int32) for f in first_ids])


async def submit(svc: InferenceService, req: Request) -> np.ndarray:
    fut = asyncio.get_running_loop().create_future()
    req.on_done = lambda r: fut.done() or fut.set_result(None)
    svc.scheduler.add(req)
    svc._wake.set()
    await fut
    assert req.error is None, req.error
    return np.stack(req.rows)  # type: ignore[arg-type]


def run_loop(engine: DeviceLikeEngine, body):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        svc = InferenceService(ServeConfig(), load_spec(None), max_batch_tokens=1024, depth=2)
        svc.attach(engine)
        task = asyncio.create_task(svc.run())
        try:
            return await body(svc), threading.get_ident()
        finally:
            task.cancel()
    return asyncio.run(main())


def test_graph_replays_are_stepped_on_the_loop_other_batches_in_a_thread() -> None:
    engine = DeviceLikeEngine(graph_tokens=64, seconds=lambda b: 0.05)  # long enough to be running when looked at

    async def body(svc: InferenceService):  # type: ignore[no-untyped-def]
        small = await submit(svc, request([11], 16))
        large = await submit(svc, request([21, 22], 200))
        return small, large

    (small, large), loop_thread = run_loop(engine, body)
    assert small[:, 0].tolist() == [11] and large[:, 0].tolist() == [21, 22]
    (t_small, _, _, h_small), (t_large, _, _, h_large) = engine.steps
    assert t_small == loop_thread and t_large != loop_thread
    # The replay ran with nothing else queued or in flight: waited for on the loop (no thread
    # hops); the eager batch, unbounded, off the loop.
    assert h_small.waited_on == [loop_thread]
    assert h_large.waited_on and h_large.waited_on[0] != loop_thread


def test_a_running_replay_is_waited_off_the_loop_while_other_work_waits() -> None:
    engine = DeviceLikeEngine(graph_tokens=64, seconds=lambda b: 0.03)

    async def body(svc: InferenceService):  # type: ignore[no-untyped-def]
        svc.scheduler = Scheduler(16)  # one request per batch (the loop reads the attribute each turn)
        first = asyncio.create_task(submit(svc, request([1], 16)))
        second = asyncio.create_task(submit(svc, request([2], 16)))  # queued before the loop looks
        return await first, await second

    (first, second), loop_thread = run_loop(engine, body)
    assert first[:, 0].tolist() == [1] and second[:, 0].tolist() == [2]
    (_, _, _, h1), (_, _, _, h2) = engine.steps
    # the second batch was launched while the first ran (depth 2), so the first was waited for
    # in a helper thread and the loop stayed free; the second, alone by then, on the loop
    assert h1.waited_on and h1.waited_on[0] != loop_thread
    assert h2.waited_on == [loop_thread]


def test_a_finished_result_is_read_on_the_loop() -> None:
    engine = DeviceLikeEngine(graph_tokens=64, seconds=lambda b: 0.0)

    async def body(svc: InferenceService):  # type: ignore[no-untyped-def]
        return await submit(svc, request([5], 8))

    rows, loop_thread = run_loop(engine, body)
    assert rows[:, 0].tolist() == [5]
    (t, _, _, h), = engine.steps
    assert t == loop_thread and h.waited_on == [loop_thread]


def test_depth_bounds_batches_in_flight_and_all_requests_complete() -> None:
    engine = DeviceLikeEngine(graph_tokens=64, seconds=lambda b: 0.004)

    async def body(svc: InferenceService):  # type: ignore[no-untyped-def]
        tasks = []
        for k in range(8):
            tasks.append(asyncio.create_task(submit(svc, request([100 + k], 40))))
            await asyncio.sleep(0.001)
        return await asyncio.gather(*tasks)

    results, _ = run_loop(engine, body)
    assert [r[:, 0].tolist() for r in results] == [[100 + k] for k in range(8)]
    # at any launch, at most depth (2) earlier batches had not finished yet
    for i, (_, _, launch, _) in enumerate(engine.steps):
        running = [h for _, _, _, h in engine.steps[:i] if h.done_at > launch]
        assert len(running) <= 1  # the service launches only with fewer than depth (2) in flight


def test_the_engine_is_built_warmed_up_and_stepped_on_one_thread() -> None:
    # libgomp keeps an OpenMP team per thread that ever ran a parallel region; with more of its
    # threads than cores it stops spinning at barriers (server/service.py ``on_step_thread``)
    built_on: list[int] = []
    warmed_on: list[int] = []

    def build() -> DeviceLikeEngine:
        built_on.append(threading.get_ident())
        e = DeviceLikeEngine(graph_tokens=0, seconds=lambda b: 0.0)  # no replays: every step off the loop
        e.warmup = lambda: warmed_on.append(threading.get_ident())  # type: ignore[method-assign]
        return e

    async def main():  # type: ignore[no-untyped-def]
        svc = InferenceService(ServeConfig(), load_spec(None), max_batch_tokens=1024, depth=1)
        engine = await svc.on_step_thread(build)
        await svc.on_step_thread(engine.warmup)
        svc.attach(engine)
        task = asyncio.create_task(svc.run())
        try:
            for first in (5, 6, 7):
                assert (await submit(svc, request([first], 32)))[0, 0] == first
        finally:
            task.cancel()
        return engine, threading.get_ident()

    engine, loop_thread = asyncio.run(main())
    step_threads = {t for t, *_ in engine.steps}
    assert len(engine.steps) == 3 and step_threads == set(built_on) == set(warmed_on)
    assert loop_thread not in step_threads
