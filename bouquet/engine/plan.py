"""The kernel plan: which device this is (``DeviceProfile``), every threshold and tile plan the
engine's kernel choices read, and which families of Triton kernels run (``KernelPlan``).

Nothing else in the engine asks the device what it is: ``profile_of(device)`` answers once per
device and everything reads its answer. ``KernelPlan.for_profile`` makes the load-time choices
(linear.select.assign_methods gives each projection its method from it; dispatch.py renders the table of
what runs per family and step size, shown in docs/engine.md). The figures behind each threshold
are in docs/decisions.md ("2026-12-04: the kernel plan").

The one "is this a measured GPU" rule: ``DeviceProfile.measured_hopper``, an NVIDIA (not ROCm)
GPU of compute capability 9.x: the only GPU kind the Triton GEMMs, tiles and PDL were measured on.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

MIN_CUDA = (12, 3)  # stream capture of PDL launches (graph programmatic edges) needs CUDA 12.3

# fp8 (linear/fp8.py): steps of at least this many tokens run the quantized projections (every step)
FP8_MIN_TOKENS = 1

# split-K GEMM (splitk.py) for the projections back to the hidden size of small model-dtype steps
SPLITK_MAX_TOKENS = 256  # above this cuBLAS (at 512 tokens split-K replays were 3–5% slower)
SPLITK_NARROW_MAX_TOKENS = 128  # up to here 64 × 32 tiles; above, the wide plan of ``splitk_plan``
# warm-up step lengths (Engine.warmup), one per set of compiled small-step kernels above its 8-token
# step: 128 (the small GEMMs' and split-K's tiles above 64 tokens), 256 (the wide split-K plan)
WARM_TOKENS = (128, 256)

# gate/up GEMM with the activation in its epilogue (fused_gemms.gate_up_act), large steps
GATE_UP_MIN_TOKENS = 2048  # the smallest step measured faster than cuBLAS + the activation kernel
GATE_UP_MIN_WAVES = 2.5  # output tiles per SM below which the last wave's idle SMs cost more than the pass saved
GATE_UP_TILE = dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3)  # fastest at 2,048–16,384

# small-step Triton GEMMs (fused_gemms.small_linear / small_gate_up_act): qkv and MLP-in at batch 1
SMALL_MAX_TOKENS = 128
SMALL_MAX_OUTPUTS = 128 * 3072  # T·N of a plain (non-gated) small GEMM: above, cuBLAS
SMALL_LAUNCH = {"num_warps": 4, "num_stages": 3}  # Triton launch options of small_gemm_kernel

# programmatic dependent launch (pdl.py): kernels that may follow cuBLAS take PDL only with a grid
# of at most this many programs; weights prefetched into L2 before the wait only up to this size
PDL_MAX_PROGRAMS = 64
PDL_PREFETCH_MAX_BYTES = 7 << 20

# attention (attention/backends.py): (BLOCK_M, BLOCK_N, num_warps, num_stages) of kernels.varlen_attn_kernel
# per head dim; one sequence of more than SINGLE_MIN_SEQLEN tokens alone takes TRITON_SINGLE_CONFIGS
# (on a measured Hopper); one causal sequence of more than CUDNN_SINGLE_MIN_TOKENS rows runs cuDNN
# (head dims CUDNN_SINGLE_HEAD_DIMS); equal lengths of TRITON_UNIFORM_HEAD_DIMS stay on Triton
TRITON_ATTN_CONFIGS: dict[int, tuple[int, int, int, int]] = {32: (64, 64, 4, 3), 64: (64, 32, 4, 3), 128: (64, 32, 4, 3)}
SINGLE_MIN_SEQLEN = 128
CUDNN_SINGLE_MIN_TOKENS = 1024
CUDNN_SINGLE_HEAD_DIMS = (64, 128)
TRITON_SINGLE_CONFIGS: dict[int, tuple[int, int, int, int]] = {32: (64, 64, 4, 3), 64: (64, 64, 4, 3),
                                                               128: (64, 64, 4, 3)}
TRITON_UNIFORM_HEAD_DIMS = (32,)


@dataclass(frozen=True)
class DeviceProfile:
    """What the engine needs to know about a device, read once (``profile_of``) or built by hand
    (tests, docs: ``DeviceProfile.h200()``).

    kind "cuda" | "cpu"; capability (major, minor) (CUDA compute capability, (0, 0) off CUDA);
    hip: a ROCm build; sms: streaming multiprocessors; smem_optin: shared memory per block a
    kernel may opt into (bytes); cuda / driver: CUDA versions of the build and the driver
    ((major, minor); driver None: unknown, the build's decides); gdc: Triton has ``griddepcontrol``."""

    kind: str
    name: str = ""
    capability: tuple[int, int] = (0, 0)
    hip: bool = False
    sms: int = 0
    smem_optin: int = 0
    cuda: tuple[int, int] | None = None
    driver: tuple[int, int] | None = None
    gdc: bool = False

    @property
    def measured_hopper(self) -> bool:
        """NVIDIA Hopper (compute capability 9.x, not ROCm): where every Triton GEMM, tile plan and
        PDL rule here was measured (an H200)."""
        return self.kind == "cuda" and not self.hip and self.capability[0] == 9

    @property
    def pdl(self) -> bool:
        """Triton kernels launch with programmatic dependent launch: a measured Hopper, CUDA ≥
        ``MIN_CUDA`` in the build and the driver, a Triton with ``griddepcontrol``."""
        return (self.measured_hopper and self.cuda is not None and self.cuda >= MIN_CUDA
                and (self.driver is None or self.driver >= MIN_CUDA) and self.gdc)

    @property
    def fp8_tensor_cores(self) -> bool:
        """CUDA compute capability 8.9+ (Ada, Hopper, later); the CPU emulates fp8 exactly."""
        return self.kind != "cuda" or self.capability >= (8, 9)

    def tma_smem(self, need: int) -> bool:
        """TMA tensor descriptors (NVIDIA, capability 9.0+) and ``need`` bytes of shared memory per block."""
        return not self.hip and self.capability >= (9, 0) and self.smem_optin >= need

    @classmethod
    def cpu(cls) -> "DeviceProfile":
        return cls("cpu", "cpu")

    @classmethod
    def h200(cls) -> "DeviceProfile":
        """The GPU the plan was measured on (NVIDIA H200: 132 SMs, 227 KiB of shared memory per block)."""
        return cls("cuda", "NVIDIA H200", (9, 0), False, 132, 232448, (12, 8), (12, 8), True)

    @classmethod
    def read(cls, device: torch.device) -> "DeviceProfile":
        """Ask torch (and Triton, for ``gdc``) about ``device``."""
        if device.type != "cuda":
            return cls(device.type, device.type)
        props = torch.cuda.get_device_properties(device)
        cuda = None
        if torch.version.hip is None and torch.version.cuda is not None:
            cuda = tuple(int(v) for v in torch.version.cuda.split(".")[:2])
        try:  # e.g. 13000; a 12.2 driver runs a 12.4 build, and capture of PDL launches is the driver's
            raw = int(torch._C._cuda_getDriverVersion())
        except (AttributeError, RuntimeError, TypeError):  # not in this build: the build's version decides
            raw = 0
        try:  # griddepcontrol: Triton 3.4+ (what kernels/triton_kernels.py's HAS_GDC reads)
            from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
            gdc = True
        except ImportError:  # no Triton, or an older one
            gdc = False
        return cls("cuda", torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)),
                   torch.version.hip is not None, props.multi_processor_count,
                   getattr(props, "shared_memory_per_block_optin", 0), cuda,  # type: ignore[arg-type]
                   (raw // 1000, raw % 1000 // 10) if raw else None, gdc)


@functools.lru_cache(maxsize=16)
def _profile(kind: str, index: int | None) -> DeviceProfile:
    return DeviceProfile.read(torch.device(kind, index) if index is not None else torch.device(kind))


def profile_of(device: "torch.device | int") -> DeviceProfile:
    """The device's profile, read once per device (an int: that CUDA device)."""
    if isinstance(device, int):
        return _profile("cuda", device)
    if device.type == "cuda":
        return _profile("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return _profile(device.type, None)


@dataclass(frozen=True)
class SplitPlan:
    """Tiles of one split-K launch: output tile bm × bn, K step bk, ``parts`` K ranges; Triton's
    num_warps / num_stages."""

    bm: int
    bn: int
    bk: int
    parts: int
    warps: int = 4
    stages: int = 3

    def smem_bytes(self, elem: int = 2) -> int:
        """Shared memory the pipelined loads need (bytes): ``stages`` buffers of the x and w tiles
        (Triton on Hopper keeps num_stages − 1 in flight plus one more for a wgmma operand)."""
        return self.stages * (self.bm + self.bn) * self.bk * elem

    def fits(self, T: int, N: int, K: int) -> bool:
        """Whether the plan tiles a [T, K] · [N, K]ᵀ product exactly in N and K (T is masked)."""
        return N % self.bn == 0 and K % (self.parts * self.bk) == 0 and self.parts >= 2 and self.bm >= 16


@functools.lru_cache(maxsize=4096)
def splitk_plan(T: int, N: int, K: int, sms: int) -> SplitPlan | None:
    """The split-K plan for T tokens through an [N, K] weight on a GPU of ``sms`` SMs, or None
    where cuBLAS is the better choice (more than SPLITK_MAX_TOKENS tokens, K too short to split,
    sizes that do not tile). Up to ``SPLITK_NARROW_MAX_TOKENS`` tokens: 64 × 32 tiles, K ranges of
    at least 192 columns, at most 16 parts and 3 waves of ``sms`` programs; above, 64 × 128 tiles,
    4 stages, K in 4 ranges (again at most 3 waves)."""
    if T > SPLITK_MAX_TOKENS or T < 1:
        return None
    if T > SPLITK_NARROW_MAX_TOKENS:
        plan = SplitPlan(64, 128, 64, 4, warps=4, stages=4)
        waves_ok = -(-T // plan.bm) * (N // plan.bn) * plan.parts <= 3 * sms
        return plan if plan.fits(T, N, K) and K // plan.parts >= 2 * plan.bk and waves_ok else None
    bm, bn = 64, 32
    parts = 1
    tiles = -(-T // bm) * -(-N // bn)
    while (K % (parts * 2) == 0 and (K // (parts * 2)) % 64 == 0 and K // (parts * 2) >= 192 and parts < 16
           and tiles * parts * 2 <= 3 * sms):
        parts *= 2
    k_split = K // parts
    bk = 128 if k_split >= 256 and k_split % 128 == 0 else 64
    plan = SplitPlan(bm, bn, bk, parts)
    return plan if plan.fits(T, N, K) else None


def small_tiles(T: int, N: int, K: int, sms: int) -> tuple[int, int, int] | None:
    """(BM, BN, BK) of a small-step GEMM: 64-row tiles, the widest of 32 / 16 columns that still
    gives every SM a program; None when N or K do not tile."""
    bn = 32 if -(-T // 64) * (N // 32) >= sms and N % 32 == 0 else 16
    if N % bn or K % 64:
        return None
    return 64, bn, 128 if K % 128 == 0 else 64


def gate_up_tiles(T: int, I: int) -> int:
    """Output tiles of the large-step gate/up GEMM for T tokens and I intermediate columns."""
    return -(-T // GATE_UP_TILE["BM"]) * -(-I // GATE_UP_TILE["BN"])


def gate_up_smem() -> int:
    """Shared memory the gate/up tile's stages need (bytes, bf16: one x tile and two weight tiles)."""
    t = GATE_UP_TILE
    return t["num_stages"] * (t["BM"] + 2 * t["BN"]) * t["BK"] * 2


@dataclass(frozen=True)
class KernelPlan:
    """Which families of Triton GEMMs an engine runs (each choice per projection and step size is
    then made by linear.select.assign_methods): ``split_k`` (hidden-size projections of small steps),
    ``gate_up_act`` (gated MLPs' gate/up + activation, large steps), ``small_gemms`` (qkv and MLP-in
    of small steps, worth it only with PDL); all on a measured Hopper (``small_gemms`` with PDL
    too) unless ``triton_gemms`` is off (``--no-triton-gemms``), all off elsewhere. ``onednn``: on
    the CPU every fp32 / bf16 projection runs oneDNN with its weight prepacked at load (at 14
    tokens 40% faster than PyTorch's GEMM, on par in bulk: docs/decisions.md, 2026-12-04)."""

    profile: DeviceProfile
    split_k: bool
    gate_up_act: bool
    small_gemms: bool
    onednn: bool = False  # the CPU: oneDNN linears with prepacked weights (linear/cpu.py)

    @classmethod
    def for_profile(cls, profile: DeviceProfile, triton_gemms: bool = True) -> "KernelPlan":
        on = triton_gemms and profile.measured_hopper
        cpu = profile.kind == "cpu" and torch.backends.mkldnn.is_available()
        return cls(profile, on, on, on and profile.pdl, cpu)

    def log_lines(self) -> list[str]:
        """What the engine logs at start (CUDA)."""
        return [
            f"device {self.profile.name}: capability {self.profile.capability}, {self.profile.sms} SMs, "
            f"{'a measured Hopper' if self.profile.measured_hopper else 'not a measured GPU: cuBLAS throughout'}",
            f"attention output / MLP down projections of steps up to {SPLITK_MAX_TOKENS} tokens: "
            + ("split-K Triton GEMM (the add + norm kernel sums the parts)" if self.split_k else "cuBLAS"),
            f"gated MLP of steps from {GATE_UP_MIN_TOKENS} tokens: "
            + ("gate/up GEMM with the activation in its epilogue (Triton)" if self.gate_up_act
               else "cuBLAS gate/up, then the activation kernel"),
            f"qkv and MLP-in projections of steps up to {SMALL_MAX_TOKENS} tokens: "
            + ("Triton GEMMs with the bias / activation in their epilogue" if self.small_gemms else "cuBLAS"),
            "Triton kernels launch " + ("with programmatic dependent launch (pdl.py)" if self.profile.pdl
                                        else "plainly (no programmatic dependent launch here)"),
        ]
