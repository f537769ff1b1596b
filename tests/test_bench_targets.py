"""The benchmark client's reading of a server's CUDA-graph capture counter (bench/targets.py),
from a /metrics text as the gateway writes it (prometheus_client), with two replicas of two
models; the end-to-end path (a real `bouquet serve`) is in test_bench_smoke.py."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily


def _metrics(values: dict[tuple[str, str], float]) -> bytes:
    class Replicas:
        def collect(self):  # type: ignore[no-untyped-def]
            fam = CounterMetricFamily("bouquet_replica_graph_captures", "CUDA graphs captured",
                                      labels=["replica", "model"])
            for (replica, model), v in values.items():
                fam.add_metric([replica, model], v)
            yield fam

    reg = CollectorRegistry()
    reg.register(Replicas())
    return generate_latest(reg)


def test_http_target_sums_the_capture_counter_of_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from bouquet import config
    from bouquet.bench.targets import HttpTarget

    monkeypatch.setattr(config, "REPLICA_POLL_S", 0.0)
    body = _metrics({("r0", "m"): 3, ("r1", "m"): 4, ("r2", "other"): 100})
    target = HttpTarget("http://127.0.0.1:9", model="m")
    seen: list[str] = []
    monkeypatch.setattr(target, "_request", lambda method, path, timeout=0: seen.append(path) or (200, body))
    assert target.graph_captures() == 7 and seen == ["/metrics"]
    target.model = None  # no model named: every replica's
    assert target.graph_captures() == 107


def test_http_target_without_the_counter_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from bouquet import config
    from bouquet.bench.targets import HttpTarget

    monkeypatch.setattr(config, "REPLICA_POLL_S", 0.0)
    target = HttpTarget("http://127.0.0.1:9")
    monkeypatch.setattr(target, "_request", lambda method, path, timeout=0: (200, b"# other server\nx_total 1\n"))
    assert target.graph_captures() is None
    monkeypatch.setattr(target, "_request", lambda method, path, timeout=0: (404, b"not found"))
    assert target.graph_captures() is None

    def refused(method: str, path: str, timeout: float = 0) -> tuple[int, bytes]:
        raise ConnectionRefusedError(path)

    monkeypatch.setattr(target, "_request", refused)
    assert target.graph_captures() is None
