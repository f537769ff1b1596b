"""The scheduler on its own: pure Python, a fake engine made of hand-built result rows."""
from __future__ import annotations

import numpy as np
import pytest

from bouquet.server.scheduler import Priority, QueueFull, Request, Scheduler


def seq(n: int, start: int = 1) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def fake_rows(batch) -> np.ndarray:
    """The 'engine': row b = [first token id, length] of sequence b."""
    cu = batch.cu_seqlens
    return np.stack([[batch.input_ids[cu[b]], cu[b + 1] - cu[b]] for b in range(batch.num_seqs)]).astype(np.float32)


def test_fcfs_under_token_budget_and_routing():
    s = Scheduler(max_batch_tokens=10, max_batch_seqs=8)
    done = []
    a = Request([seq(4, 100), seq(4, 200)], on_done=done.append)
    b = Request([seq(3, 300), seq(5, 400)], on_done=done.append)
    s.add(a)
    s.add(b)
    sb1 = s.next_batch()
    assert [len(x) for x in np.split(sb1.batch.input_ids, sb1.batch.cu_seqlens[1:-1])] == [4, 4]  # 4+4+3 > 10
    assert sb1.batch.cu_seqlens.tolist() == [0, 4, 8] and sb1.batch.max_seqlen == 4
    assert sb1.batch.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    s.complete(sb1, fake_rows(sb1.batch))
    assert done == [a] and a.rows[1].tolist() == [200, 4]
    sb2 = s.next_batch()
    assert sb2.batch.num_tokens == 8
    s.complete(sb2, fake_rows(sb2.batch))
    assert done == [a, b] and [r.tolist() for r in b.rows] == [[300, 3], [400, 5]]
    assert s.next_batch() is None and s.pending_tokens == 0


def test_overlong_sequence_runs_alone():
    s = Scheduler(max_batch_tokens=4)
    s.add(Request([seq(9), seq(2)]))
    assert s.next_batch().batch.num_tokens == 9
    assert s.next_batch().batch.num_tokens == 2


def test_sequence_slot_limit():
    s = Scheduler(max_batch_tokens=1000, max_batch_seqs=3)
    s.add(Request([seq(1) for _ in range(7)]))
    assert [s.next_batch().batch.num_seqs for _ in range(3)] == [3, 3, 1]


def test_interactive_before_batch():
    s = Scheduler(max_batch_tokens=8)
    bulk = Request([seq(4, 10 * i) for i in range(1, 5)], priority=Priority.BATCH)
    s.add(bulk)
    first = s.next_batch()  # bulk starts running
    q = Request([seq(2, 999)], priority=Priority.INTERACTIVE)
    s.add(q)
    nxt = s.next_batch()
    assert nxt.owners == [(q, 0)]  # the query jumps the remaining bulk work, in a batch of its own
    assert first.owners[0][0] is bulk
    assert [i for _, i in s.next_batch().owners] == [2, 3]  # then bulk resumes in order
    assert s.next_batch() is None


def test_cancel_drops_queued_and_ignores_inflight_rows():
    s = Scheduler(max_batch_tokens=4)
    calls = []
    r = Request([seq(4), seq(4), seq(4)], on_done=calls.append)
    s.add(r)
    inflight = s.next_batch()
    assert s.cancel(r) == 2 and s.stats.cancelled_seqs == 2 and s.pending_tokens == 0
    assert s.next_batch() is None
    s.complete(inflight, fake_rows(inflight.batch))  # late rows of a cancelled request: harmless
    assert calls == []


def test_nonfinite_row_fails_only_its_request():
    s = Scheduler(max_batch_tokens=100)
    bad, good = Request([seq(2), seq(3)]), Request([seq(4)])
    s.add(bad)
    s.add(good)
    sb = s.next_batch()
    rows = fake_rows(sb.batch)
    rows[1, 0] = np.inf
    done = s.complete(sb, rows)
    assert set(done) == {bad, good}
    assert bad.error and "non-finite" in bad.error and good.error is None
    assert not bad.engine_failed  # the input's fault: 422 (FAILED_PRECONDITION), not 500


def test_engine_failure_fails_the_batch_as_the_engines_fault():
    """An exception in a step fails every request of the batch with engine_failed set: the replica
    answers INTERNAL (HTTP 500), not FAILED_PRECONDITION (422, meant for non-finite rows)."""
    s = Scheduler(max_batch_tokens=100)
    a, b = Request([seq(2)]), Request([seq(3)])
    s.add(a)
    s.add(b)
    sb = s.next_batch()
    assert set(s.complete(sb, None, error="engine failure: RuntimeError: boom")) == {a, b}
    assert a.engine_failed and b.engine_failed and a.error == b.error == "engine failure: RuntimeError: boom"


def test_queue_limit_and_validation():
    s = Scheduler(max_batch_tokens=10, max_queue_tokens=10)
    s.add(Request([seq(8)]))
    with pytest.raises(QueueFull):
        s.add(Request([seq(5)]))
    with pytest.raises(ValueError):
        s.add(Request([]))
    with pytest.raises(ValueError):
        s.add(Request([np.zeros(0, np.int32)]))


def test_fcfs_within_class_and_classes_never_mixed():
    s = Scheduler(max_batch_tokens=6, max_batch_seqs=4)
    bulk1 = Request([seq(3, 10), seq(3, 20)], priority=Priority.BATCH)
    q1 = Request([seq(2, 30), seq(2, 40)], priority=Priority.INTERACTIVE)
    bulk2 = Request([seq(1, 50)], priority=Priority.BATCH)
    q2 = Request([seq(3, 60)], priority=Priority.INTERACTIVE)
    for r in (bulk1, q1, bulk2, q2):
        s.add(r)
    order = []
    while (sb := s.next_batch()) is not None:
        assert len({r.priority for r, _ in sb.owners}) == 1  # one class per batch
        assert sb.batch.num_tokens <= 6
        order.append([(r, i) for r, i in sb.owners])
    assert order == [[(q1, 0), (q1, 1)], [(q2, 0)], [(bulk1, 0), (bulk1, 1)], [(bulk2, 0)]]


def test_server_and_offline_job_pack_alike():
    """One packing rule (bouquet/packing.py): the scheduler and the job's packer cut the same
    arrival-ordered sequences into the same batches, an over-budget one alone."""
    from bouquet.jobs.packer import Group, Packer

    rng = np.random.default_rng(3)
    owners = [[seq(int(n)) for n in rng.integers(1, 30, size=int(k))] for k in rng.integers(1, 6, size=40)]
    owners.insert(7, [seq(90)])  # longer than the budget
    s, p = Scheduler(max_batch_tokens=64, max_batch_seqs=6), Packer(max_tokens=64, max_seqs=6)
    for seqs in owners:
        s.add(Request(seqs, priority=Priority.BATCH))
        p.add(Group(seqs, None, 2))
    server, job = [], []
    while (sb := s.next_batch()) is not None:
        server.append(sb.batch.cu_seqlens.tolist())
    while p:
        job.append(p.take()[0].cu_seqlens.tolist())
    assert server == job and len(server) > 10
    assert [0, 90] in server and s.pending_tokens == p.pending_tokens == 0


def test_prompt_left_out_of_pooling_travels_per_sequence():
    """Requests with different prompts share a batch; ``Batch.pool_skip`` holds each sequence's
    own count (None when no sequence leaves tokens out)."""
    s = Scheduler(max_batch_tokens=100)
    s.add(Request([seq(6), seq(7)], pool_skip=3))
    s.add(Request([seq(5)]))
    sb = s.next_batch()
    assert sb is not None and sb.batch.pool_skip is not None
    assert sb.batch.pool_skip.tolist() == [3, 3, 0]
    s.add(Request([seq(4)]))
    assert s.next_batch().batch.pool_skip is None
