"""Device and dtype policy: one place for generation, training and serving."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from gpt2 import InvalidArgumentError, MemoryLimitError, devices
from gpt2.devices import WeightFormat, process_device, resolve_device, resolve_dtype, training_precision, weight_format


def test_devices_and_dtypes():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(InvalidArgumentError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidArgumentError, match="CUDA is not available on this machine"):
            resolve_device("cuda")
    with pytest.raises(InvalidArgumentError, match="unsupported dtype 'int8': use one of float32, bfloat16, float16"):
        resolve_dtype("int8")
    assert resolve_dtype(torch.float16) is torch.float16


def test_weight_formats_are_weight_only_on_the_cpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")  # the policy needs no GPU to be stated
    assert weight_format("float32", cpu) == WeightFormat(torch.float32, torch.float32)
    for name in ("bfloat16", "float16"):
        dtype = getattr(torch, name)
        assert weight_format(name, cpu) == WeightFormat(dtype, torch.float32)  # no fast 16-bit arithmetic
        assert weight_format(dtype, gpu) == WeightFormat(dtype, dtype)
    assert weight_format("int8", cpu) == WeightFormat(torch.int8, torch.float32)
    with pytest.raises(InvalidArgumentError, match="int8 weights are for decoding on the CPU, not on cuda"):
        weight_format("int8", gpu)
    with pytest.raises(
        InvalidArgumentError, match="unsupported dtype 'int4': use one of float32, bfloat16, float16, int8"
    ):
        weight_format("int4", cpu)


def test_mps_asked_for_where_there_is_none():
    if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        with pytest.raises(InvalidArgumentError, match="Apple's MPS is not available on this machine"):
            resolve_device("mps")


def test_training_precision():
    cpu = torch.device("cpu")
    assert training_precision(cpu).compute is torch.float32  # auto: float32 on the CPU
    assert not training_precision(cpu).needs_scaler
    assert training_precision(cpu, "bfloat16").compute is torch.bfloat16
    with pytest.raises(InvalidArgumentError, match="dtype 'float16' trains on GPUs only"):
        training_precision(cpu, "float16")
    with pytest.raises(InvalidArgumentError, match="unsupported dtype 'int8' for training"):
        training_precision(cpu, "int8")
    with training_precision(cpu, "bfloat16").autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype is torch.bfloat16
    with training_precision(cpu).autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype is torch.float32


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_precision_on_cuda():
    precision = training_precision(torch.device("cuda"))
    assert precision.compute is (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    assert precision.needs_scaler == (precision.compute is torch.float16)


def test_the_dtype_names_are_torchs():
    """The torch-free names the settings and the command line offer (gpt2.settings) are torch's dtypes."""
    assert {name: getattr(torch, name) for name in devices.WEIGHT_DTYPES} == devices.DTYPES
    assert devices.INFERENCE_DTYPES == ("float32", "bfloat16", "float16", "int8")
    assert devices.TRAINING_DTYPES == ("auto", "float32", "bfloat16", "float16")


def test_training_compiles_on_cuda_only_unless_told():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")  # the policy needs no GPU to be stated
    assert [devices.should_compile(mode, cpu) for mode in ("auto", "on", "off")] == [False, True, False]
    assert [devices.should_compile(mode, gpu) for mode in ("auto", "on", "off")] == [True, True, False]


def test_adamw_is_fused_where_torch_has_the_fused_update():
    """Where the policy says fused, torch's fused AdamW runs there and gives what the unfused one does."""
    cpu = torch.device("cpu")
    assert devices.fused_adamw_available(cpu) and devices.fused_adamw_available(torch.device("cuda"))
    assert not devices.fused_adamw_available(torch.device("mps"))
    weights = []
    for fused in (True, False):
        w = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
        optimizer = torch.optim.AdamW([w], lr=0.1, fused=fused)
        w.grad = torch.ones(2, 3)
        optimizer.step()
        weights.append(w.detach())
    torch.testing.assert_close(weights[0], weights[1])


def test_tf32_is_for_cuda_only():
    flags = torch.backends.cuda.matmul, torch.backends.cudnn
    before = [flag.allow_tf32 for flag in flags]
    try:
        for flag in flags:
            flag.allow_tf32 = False
        devices.enable_tf32(torch.device("cpu"))
        assert [flag.allow_tf32 for flag in flags] == [False, False]
        devices.enable_tf32(torch.device("cuda"))  # sets the flags; without a GPU they do nothing
        assert [flag.allow_tf32 for flag in flags] == [True, True]
    finally:
        for flag, value in zip(flags, before):
            flag.allow_tf32 = value


def test_each_process_of_a_distributed_launch_takes_its_device(monkeypatch):
    assert process_device("cpu", 3) == torch.device("cpu")  # gloo: every process on the CPU
    if not torch.cuda.is_available():
        assert process_device("auto", 1) == torch.device("cpu")
        with pytest.raises(InvalidArgumentError, match="CUDA is not available"):
            process_device("cuda", 0)
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    with pytest.raises(InvalidArgumentError, match="not MPS: use device 'cpu'") as e:
        process_device("mps", 0)
    assert e.value.param == "device"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_each_process_takes_the_gpu_of_its_local_rank():
    assert process_device("auto", 0) == process_device("cuda", 0) == torch.device("cuda", 0)
    with pytest.raises(InvalidArgumentError, match="each process takes the GPU of its local rank; use device 'cuda'"):
        process_device("cuda:0", 0)
    with pytest.raises(InvalidArgumentError, match=f"local rank {torch.cuda.device_count()} has no GPU"):
        process_device("cuda", torch.cuda.device_count())


def test_available_memory_is_the_kernels_figure():
    cpu = torch.device("cpu")
    available = devices.available_memory(cpu)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < available <= total
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    assert abs(available - int(meminfo["MemAvailable"].split()[0]) * 1024) < 0.05 * total  # read a moment apart


def test_what_cannot_fit_is_refused_and_what_might_not_warns(monkeypatch):
    """The rule: up to the memory available, silent; up to FITS_MARGIN (1.25) times it, a warning; beyond, refused."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(devices, "available_memory", lambda device: 8_000_000_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devices.check_fits(8_000_000_000, cpu, "training", "lower --batch-size")  # all of it: fits
    with pytest.warns(
        devices.MemoryWarning,
        match="training needs about 9.6 GB of memory, but the CPU has 8.0 GB "
        "available, so it may not fit: lower --batch-size",
    ):
        devices.check_fits(9_600_000_000, cpu, "training", "lower --batch-size")
    with pytest.raises(
        MemoryLimitError,
        match="training needs about 10.1 GB of memory, but the CPU has 8.0 GB available: lower --batch-size",
    ):
        devices.check_fits(10_100_000_000, cpu, "training", "lower --batch-size")
    monkeypatch.setattr(devices, "available_memory", lambda device: None)  # unknown (MPS): nothing said
    devices.check_fits(10**15, cpu, "training", "lower --batch-size")


def test_bytes_read_as_people_read_them():
    assert [devices.format_bytes(n) for n in (512_000, 35_000_000, 1_234_000_000, 412_300_000_000_000)] == [
        "512 kB",
        "35.0 MB",
        "1.2 GB",
        "412.3 TB",
    ]
