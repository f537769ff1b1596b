"""Prometheus metrics of the gateway and, re-exported per replica, of the server processes.

One ``CollectorRegistry`` per app instance (never the process-global default), so several apps
can live in one process (tests). Gateway-side numbers are observed directly; replica numbers
(queue, batch sizes, cancellations, CUDA graphs) come from the replicas' gRPC ``Info`` replies,
which the replica pool's health loop refreshes about once a second — they lag by up to that much.

``--gateway-workers N``: each worker process answers the scrapes that reach it, so its gateway
counters alone would jump between the workers' values from scrape to scrape. The launcher gives
the workers one folder (``PROMETHEUS_MULTIPROC_DIR``, prometheus_client's multiprocess mode: each
process writes its values to memory-mapped files there; ``BOUQUET_METRICS_DIR`` names the same
folder to this module, so a variable from the user's own environment never makes a gateway read or
delete files) and ``render`` sums the files of every worker (``MultiProcessCollector``). Files
stay while the launcher lives (a restarted worker's counts stay in the sums, as prometheus_client
keeps a dead process's counters) and the launcher removes the folder; a worker removes its own only
when the launcher is gone (killed with SIGKILL), and the last one out the folder.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bouquet.gateway.replicas import ReplicaPool

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's name for the shared folder
BOUQUET_METRICS_ENV = "BOUQUET_METRICS_DIR"  # the same folder, set by the launcher alongside it
LABELS = ["replica", "model"]  # of every per-replica metric
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class GatewayMetrics:
    """The gateway's instruments. ``route`` labels are route paths (unknown paths → "other")."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # set by the launcher for its gateway workers only; prometheus_client read it at import
        # time already (its values live in that folder's files then), this decides how to render
        self.multiproc_dir = os.environ.get(BOUQUET_METRICS_ENV) or None
        self._replicas: Collector | None = None
        r = self.registry
        self.requests = Counter("bouquet_http_requests", "HTTP requests by route, method and status code",
                                ["route", "method", "status"], registry=r)
        self.refusals = Counter("bouquet_http_refusals", "Requests the HTTP front end refused before the app "
                                "(protocol.py: 400, 408, 413, 414, 431, 501, 503, 505) by status and error code",
                                ["status", "code"], registry=r)
        self.latency = Histogram("bouquet_http_request_duration_seconds", "HTTP request latency (s), whole request",
                                 ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tokenize_seconds = Histogram("bouquet_tokenization_duration_seconds", "Tokenization time per call (s)",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        self.inference_seconds = Histogram("bouquet_inference_duration_seconds",
                                           "Gateway → replicas → gateway time per inference call (s)",
                                           buckets=_LATENCY_BUCKETS, registry=r)

    def watch_replicas(self, pools: Sequence[tuple[str, "ReplicaPool"]]) -> None:
        """Export the replicas of every (model public id, pool); call once (one collector for all
        models: each metric family may be registered only once)."""
        self._replicas = ReplicaCollector(pools)
        self.registry.register(self._replicas)

    def render(self) -> bytes:
        if self.multiproc_dir is None:
            return generate_latest(self.registry)
        reg = CollectorRegistry()  # every worker's gateway counters, summed from their files
        MultiProcessCollector(reg, path=self.multiproc_dir)
        if self._replicas is not None:  # the replica metrics: this worker's view (each worker polls all)
            reg.register(self._replicas)
        return generate_latest(reg)

    def forget_process(self, launcher_alive: bool) -> None:
        """At a worker's exit, when the launcher that owns the shared folder is gone: remove this
        worker's files, and the folder once no worker has any left. With the launcher alive
        nothing is removed (a worker the supervisor restarts must not take its counts out of the
        sums); the launcher removes the folder as it exits."""
        if self.multiproc_dir is None or launcher_alive:
            return
        folder = Path(self.multiproc_dir)
        for f in folder.glob(f"*_{os.getpid()}.db"):
            f.unlink(missing_ok=True)
        try:
            folder.rmdir()  # the last worker out (after a launcher killed with SIGKILL, no one else does)
        except OSError:
            pass


class ReplicaCollector(Collector):
    """Turns each replica's last ``Info`` reply into metrics labelled ``replica="host:port"`` and
    ``model`` (the public id of the model it serves)."""

    def __init__(self, pools: Sequence[tuple[str, "ReplicaPool"]]) -> None:
        self.pools = list(pools)

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("bouquet_replica_up", "1 when the replica is loaded and healthy", labels=LABELS)
        queue = GaugeMetricFamily("bouquet_replica_queue_tokens", "Tokens waiting in the replica's scheduler",
                                  labels=LABELS)
        inflight = GaugeMetricFamily("bouquet_replica_inflight_requests", "Embed calls waiting on the replica",
                                     labels=LABELS)
        outstanding = GaugeMetricFamily("bouquet_replica_outstanding_tokens",
                                        "Tokens the gateway has sent to the replica and not had back", labels=LABELS)
        counters = {
            "cancelled_sequences": CounterMetricFamily("bouquet_replica_cancelled_sequences",
                                                       "Queued sequences dropped because their client left", labels=LABELS),
            "graph_captures": CounterMetricFamily("bouquet_replica_graph_captures", "CUDA graphs captured", labels=LABELS),
            "graph_replays": CounterMetricFamily("bouquet_replica_graph_replays", "CUDA graph replays", labels=LABELS),
        }
        step_tokens = HistogramMetricFamily("bouquet_replica_batch_tokens", "Tokens per engine step", labels=LABELS)
        step_seqs = HistogramMetricFamily("bouquet_replica_batch_sequences", "Sequences per engine step", labels=LABELS)
        step_time = CounterMetricFamily("bouquet_replica_step_seconds", "Engine step time, launch to rows ready (s)",
                                        labels=LABELS)
        for model, rep in ((m, r) for m, pool in self.pools for r in pool.replicas):
            lab = [rep.address, model]
            up.add_metric(lab, 1.0 if rep.healthy else 0.0)
            outstanding.add_metric(lab, rep.outstanding_tokens)
            info = rep.info
            if info is None:
                continue
            queue.add_metric(lab, info.pending_tokens)
            inflight.add_metric(lab, info.inflight_requests)
            for name, fam in counters.items():
                fam.add_metric(lab, getattr(info, name))
            step_tokens.add_metric(lab, _buckets(info.batch_tokens_le, info.batch_tokens_cumulative, info.batches),
                                   float(info.batch_tokens))
            step_seqs.add_metric(lab, _buckets(info.batch_sequences_le, info.batch_sequences_cumulative, info.batches),
                                 float(info.batch_sequences))
            step_time.add_metric(lab, info.step_seconds_sum)
        yield from (up, queue, inflight, outstanding, *counters.values(), step_tokens, step_seqs, step_time)


def _buckets(bounds: Any, cumulative: Any, total: int) -> list[tuple[str, float]]:
    return [*((repr(float(b)), float(c)) for b, c in zip(bounds, cumulative)), ("+Inf", float(total))]
