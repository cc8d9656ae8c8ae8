"""Where torch work runs and in what precision: one policy for generation, training and serving.

- Devices: "auto" is CUDA where present, else Apple's MPS, else the CPU. Asking for a device
  the machine lacks is an error, never a silent fallback. Under torchrun each process takes
  one GPU, cuda:LOCAL_RANK (`process_device`).
- Weights: float32 by default; bfloat16 or float16 on request (`resolve_dtype`). For inference
  (`weight_format`), on the CPU bfloat16, float16 and int8 are weight-only: the big matrices are
  stored narrow, and everything else, the activations included, stays float32, since the CPU
  has no fast 16-bit arithmetic; decoding reads the narrow weights and widens them as it goes.
- Training: parameters stay float32, and on CUDA the forward pass runs under autocast in
  bfloat16 where the GPU has it, else float16 with a gradient scaler (`training_precision`);
  elsewhere float32. TF32 matrix units are on for CUDA training, as in nanoGPT (`enable_tf32`);
  `--compile auto` compiles the step on CUDA only (`should_compile`); AdamW's update is fused
  on CUDA and the CPU (`fused_adamw_available`).
- The names of the dtypes (`WEIGHT_DTYPES`, `INFERENCE_DTYPES`, `TRAINING_DTYPES`) live in the
  torch-free `settings`, so that the command line offers them without importing torch.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch

from gpt2._checks import positive_int
from gpt2.errors import GPT2Warning, InvalidArgumentError, MemoryLimitError
from gpt2.settings import INFERENCE_DTYPES, TRAINING_DTYPES, WEIGHT_DTYPES

DTYPES = {name: getattr(torch, name) for name in WEIGHT_DTYPES}  # "float32" -> torch.float32
DEVICES = "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" is CUDA, else MPS, else CPU; asking for a device that is not there is an error."""
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise InvalidArgumentError(f"device must be {DEVICES}, got {device!r}", "device")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise InvalidArgumentError(f"unknown device {device!r}: use {DEVICES}", "device") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgumentError(
                f"device {device!r} asked for, but CUDA is not available on this machine; use 'cpu' or 'auto'", "device"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise InvalidArgumentError(
                f"device {device!r} asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)",
                "device",
            )
    elif resolved.type == "mps":
        if not mps_available():
            raise InvalidArgumentError(
                f"device {device!r} asked for, but Apple's MPS is not available on this machine; use 'cpu' or 'auto'",
                "device",
            )
    elif resolved.type != "cpu":
        raise InvalidArgumentError(f"unsupported device {device!r}: use {DEVICES}", "device")
    return resolved


def process_device(device: str, local_rank: int) -> torch.device:
    """The device of process `local_rank` of a distributed launch: cuda:LOCAL_RANK where the
    setting is "auto" or "cuda" and the machine has CUDA, else the CPU (for "auto" or "cpu").
    A GPU index or MPS cannot be shared out this way: an error says so."""
    resolved = resolve_device(device)
    if resolved.type == "mps":
        raise InvalidArgumentError(
            "training on several processes runs on CUDA (NCCL) or the CPU (gloo), not MPS: use device 'cpu'", "device"
        )
    if resolved.type == "cpu":
        return resolved
    if device not in ("auto", "cuda"):
        raise InvalidArgumentError(
            f"device {device!r}: under torchrun each process takes the GPU of its local rank; use device 'cuda'",
            "device",
        )
    if local_rank >= torch.cuda.device_count():
        raise InvalidArgumentError(
            f"local rank {local_rank} has no GPU: this machine has {torch.cuda.device_count()} "
            f"(start at most that many processes a node: torchrun's --nproc_per_node)"
        )
    return torch.device("cuda", local_rank)


@dataclass(frozen=True)
class WeightFormat:
    """How an inference model holds its weights: the matrices (each Dense's weight and wte) in
    `storage`, int8 with a float32 scale per output; the rest, and the activations, in `compute`."""

    storage: torch.dtype
    compute: torch.dtype

    @property
    def weight_only(self) -> bool:
        """The matrices are narrower than the arithmetic: read narrow, computed in float32."""
        return self.storage != self.compute


def weight_format(dtype: str | torch.dtype, device: torch.device) -> WeightFormat:
    """The weight format of `dtype` (float32, bfloat16, float16 or int8) on `device`."""
    if dtype in ("int8", torch.int8):
        if device.type != "cpu":
            raise InvalidArgumentError(
                f"int8 weights are for decoding on the CPU, not on {device}: use bfloat16 or float16 there", "dtype"
            )
        return WeightFormat(torch.int8, torch.float32)
    try:
        storage = resolve_dtype(dtype)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"unsupported dtype {dtype!r}: use one of {', '.join(INFERENCE_DTYPES)}", "dtype"
        ) from None
    return WeightFormat(storage, torch.float32 if device.type == "cpu" else storage)


def resolve_dtype(dtype: str | torch.dtype = "float32") -> torch.dtype:
    """The dtype of a model's weights: float32, bfloat16 or float16 (a name or a torch.dtype)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise InvalidArgumentError(f"unsupported dtype {dtype!r}: use one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class Precision:
    """How a training step computes: float32 weights, the forward pass in `compute` under
    autocast (float32: no autocast), and a gradient scaler where float16 could underflow."""

    device: torch.device
    compute: torch.dtype

    @property
    def needs_scaler(self) -> bool:
        return self.compute == torch.float16

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.compute == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute)

    def scaler(self) -> torch.amp.GradScaler:
        """A gradient scaler, enabled only for float16 (a no-op otherwise, as nanoGPT's)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.needs_scaler)


def training_precision(device: torch.device, dtype: str = "auto") -> Precision:
    """ "auto": bfloat16 autocast on CUDA GPUs that have it, float16 (scaled) on older ones,
    float32 elsewhere (a CPU without bfloat16 units is slower in it, and MPS autocast is young).
    An explicit float16 or bfloat16 on a device that cannot compute in it is an error."""
    if dtype == "auto":
        if device.type != "cuda":
            return Precision(device, torch.float32)
        return Precision(device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    if dtype not in DTYPES:
        raise InvalidArgumentError(
            f"unsupported dtype {dtype!r} for training: use {', '.join(TRAINING_DTYPES)}", "dtype"
        )
    compute = DTYPES[dtype]
    if compute == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise InvalidArgumentError(
            "dtype 'bfloat16' asked for, but this GPU has no bfloat16: use float16 or auto", "dtype"
        )
    if compute == torch.float16 and device.type == "cpu":
        raise InvalidArgumentError(
            "dtype 'float16' trains on GPUs only (CPU autocast computes in bfloat16): use float32 or bfloat16", "dtype"
        )
    return Precision(device, compute)


# An estimate over the memory available by up to this factor warns (estimates are rough: the
# allocator, the libraries, a page cache that gives way); beyond it, the size is refused.
FITS_MARGIN = 1.25


class MemoryWarning(GPT2Warning):
    """A size whose estimated memory is a little over what the device has available."""


def available_memory(device: torch.device) -> int | None:
    """Bytes the device can still give: a GPU's free memory with what torch's allocator holds
    unused, the CPU's MemAvailable (Linux's estimate of what new allocations can take without
    swapping); None where unknown."""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # freed tensors torch keeps
        return torch.cuda.mem_get_info(device)[0] + cached
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def check_fits(
    needed: int, device: torch.device, what: str, hint: str, param: str | None = None, also: tuple[str, ...] = ()
) -> None:
    """Refuse (MemoryLimitError) what needs more than FITS_MARGIN times the memory `device` has
    available, warn (MemoryWarning) above 1x. `what` names what needs it ("training"), `hint` the
    setting to change: the parameter `param` (and the others in `also`)."""
    available = available_memory(device)
    if available is None or needed <= available:
        return
    where = "the CPU" if device.type == "cpu" else str(device)
    message = (
        f"{what} needs about {format_bytes(needed)} of memory, but {where} has {format_bytes(available)} available"
    )
    if needed > FITS_MARGIN * available:
        raise MemoryLimitError(f"{message}: {hint}", param, also)
    warnings.warn(MemoryWarning(f"{message}, so it may not fit: {hint}", param, also), stacklevel=2)


def format_bytes(n: float) -> str:
    """1.2 GB, 35.0 MB, 512 kB: decimal units, as disks and memory are sold."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 1e3:.0f} kB"


def set_threads(threads: int) -> None:
    """Run torch's CPU work on `threads` threads (torch's default: one per core, or OMP_NUM_THREADS).
    On a machine where other programs are busy, fewer threads than cores run faster: torch's
    threads wait for each other at every operation, and one that lost its core holds up all."""
    torch.set_num_threads(positive_int("threads", threads))


def enable_tf32(device: torch.device) -> None:
    """For training on `device`: on CUDA, let float32 matrix products use the TF32 units of NVIDIA
    GPUs (Ampere and newer), as nanoGPT does; elsewhere nothing changes."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def should_compile(mode: str, device: torch.device) -> bool:
    """Whether a training step runs under torch.compile: `mode` "on" or "off" as it says, "auto"
    on CUDA only (elsewhere compiling would need a C++ toolchain at run time)."""
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def fused_adamw_available(device: torch.device) -> bool:
    """Whether torch has AdamW's fused update (one pass over each tensor instead of several) on
    `device`: CUDA's and the CPU's (nanoGPT fuses on CUDA only; benchmarks/RESULTS.md)."""
    return device.type in ("cuda", "cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer reads the time it took."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# Dense peak TFLOP/s of the matrix units, by GPU name and compute dtype (vendor data sheets).
_GPU_PEAK_TFLOPS = {
    "H200": {torch.bfloat16: 989, torch.float16: 989, torch.float32: 494},
    "H100": {torch.bfloat16: 989, torch.float16: 989, torch.float32: 494},  # SXM; float32 runs as TF32
    "A100": {torch.bfloat16: 312, torch.float16: 312, torch.float32: 156},
}


def peak_flops(device: torch.device, compute: torch.dtype) -> float | None:
    """The device's peak FLOP/s for training in `compute`, for model-flops utilisation; None if unknown.

    GPUs: the data-sheet figure. CPUs: threads x clock x FMA width (float32: 32 FLOP a cycle
    with AVX2, 64 with AVX-512), an estimate, as CPUs publish no such figure.
    """
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((table[compute] * 1e12 for key, table in _GPU_PEAK_TFLOPS.items() if key in name), None)
    if device.type != "cpu":
        return None
    try:
        cpuinfo = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    mhz = next((float(line.split(":", 1)[1]) for line in cpuinfo.splitlines() if line.startswith("cpu MHz")), None)
    if mhz is None:
        return None
    per_cycle = 64 if "avx512f" in flags else 32 if "fma" in flags else 8
    return torch.get_num_threads() * mhz * 1e6 * per_cycle
