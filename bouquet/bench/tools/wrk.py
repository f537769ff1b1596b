"""Online queries driven by wrk (a C load generator: a few threads, epoll, many connections), so that
the client's own CPU stays small beside the server's at hundreds of connections, where one client
process per connection (bouquet/bench/loadgen.py) competes with the server for the cores.

Each request is one STSb test sentence (tests/data/stsbenchmark), cycled, as
``{"input": TEXT, "encoding_format": "base64"}`` on ``/v1/embeddings``. Per connection count: req/s,
p50 / p90 / p99 / max ms (wrk's latency histogram), and the non-2xx responses and socket errors.

    bouquet bench wrk --url http://127.0.0.1:8000 --connections 1,64,256 --seconds 5 --out OUT.json

Needs ``wrk`` on PATH (Debian/Ubuntu: ``apt-get install wrk``) or ``--wrk PATH``. Threads: min(connections, --threads).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]  # the source checkout (tests/data)

from bouquet.bench.sts import read_sts  # noqa: E402

# wrk runs this Lua in every thread: ``bodies`` (written below) cycled from a per-thread offset;
# done() prints one JSON line with the latency percentiles (µs in wrk) and the error counts.
LUA = r"""
local counter = 0
local offset = 0
local threads = {}
function setup(thread) thread:set("offset", #threads * 997); table.insert(threads, thread) end
function request()
  counter = counter + 1
  local body = bodies[((offset + counter) % #bodies) + 1]
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"}, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {"requests": %d, "duration_us": %d, "p50": %.3f, "p90": %.3f, "p99": %.3f, ' ..
    '"max": %.3f, "non_2xx": %d, "connect": %d, "read": %d, "write": %d, "timeout": %d}\n', summary.requests,
    summary.duration, latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, e.status, e.connect, e.read, e.write, e.timeout))
end
"""


def lua_script(texts: list[str]) -> str:
    """The Lua file: the request bodies as a Lua table, then LUA."""
    quoted = ",\n".join("[==[" + json.dumps({"input": t, "encoding_format": "base64"}) + "]==]" for t in texts)
    return "bodies = {\n" + quoted + "\n}\n" + LUA


def run(wrk: str, url: str, script: Path, connections: int, threads: int, seconds: float, timeout_s: float) -> dict[str, Any]:
    """One wrk run; returns its RESULT line as a dict with req_s added. Raises RuntimeError when wrk fails."""
    cmd = [wrk, "-t", str(min(connections, threads)), "-c", str(connections), "-d", f"{max(1, round(seconds))}s",
           "--timeout", f"{max(1, round(timeout_s))}s", "-s", str(script), url]
    p = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({p.returncode}): {p.stdout[-500:]} {p.stderr[-500:]}")
    row = json.loads(line[len("RESULT "):])
    row.update(connections=connections, req_s=round(row["requests"] / (row["duration_us"] / 1e6), 1))
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the server's base URL")
    ap.add_argument("--connections", default="1,64,256")
    ap.add_argument("--threads", type=int, default=4, help="wrk threads at most")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of the same load first, not recorded")
    ap.add_argument("--wrk", default=shutil.which("wrk") or "wrk")
    ap.add_argument("--label", default="", help="a name for the server (recorded)")
    ap.add_argument("--out", type=Path, default=None, help="JSON rows (appended to a list when the file exists)")
    a = ap.parse_args(argv)
    s1, s2, _ = read_sts(REPO / "tests" / "data" / "stsbenchmark", "test")
    script = Path(tempfile.mkdtemp(prefix="wrk-")) / "queries.lua"
    script.write_text(lua_script(list(dict.fromkeys(s1 + s2))))
    rows = []
    for c in (int(x) for x in a.connections.split(",")):
        if a.warmup > 0:
            run(a.wrk, a.url, script, c, a.threads, a.warmup, 10)
        row = {"label": a.label, **run(a.wrk, a.url, script, c, a.threads, a.seconds, 10)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.out is not None:
        old = json.loads(a.out.read_text()) if a.out.exists() else []
        a.out.write_text(json.dumps(old + rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
