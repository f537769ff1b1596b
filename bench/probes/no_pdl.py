"""Run a bouquet command with programmatic dependent launch off for the Triton kernels: the
baseline of ``ops.launch_options`` (PDL on, Hopper), in the same call as the default.

Usage (GPU): python3 bench/probes/no_pdl.py bench --model qwen3-0.6b --system engine ...
(the arguments of ``python3 -m bouquet``). The result files name the systems as usual: keep the
two runs' ``--out`` folders apart.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bouquet.engine import ops  # noqa: E402

ops._pdl_capable = lambda device_index: False  # every kernel launch: PDL=False, launch_pdl=False

from bouquet.cli import main  # noqa: E402

sys.argv = ["bouquet", *sys.argv[1:]]
main()
