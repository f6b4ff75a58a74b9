"""is_oom classifies the out-of-memory errors devices really raise (the message strings as torch, CUDA's libraries
and the CPU allocator print them), and only those; a cuBLAS allocation failure halves the batch like any OOM."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from swapkl.contract import Contract
from swapkl.errors import is_oom
from swapkl.scoring.score import score
from swapkl.scoring.slots import BatchController, DeviceOutOfMemory

OOM = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity; "
                           "77.80 GiB already allocated; 3.69 MiB free; 78.20 GiB reserved in total by PyTorch)"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmulAlgoGetHeuristic( ltHandle, "
                 "computeDesc.descriptor(), Adesc.descriptor(), Bdesc.descriptor(), Cdesc.descriptor(), "
                 "Cdesc.descriptor(), preference.descriptor(), 1, &heuristicResult, &returnedResult)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API "
                 "call, so the stacktrace below might be incorrect."),
    RuntimeError("CUDA driver error: out of memory"),
    RuntimeError("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled cuda error, "
                 "NCCL version 2.14.3\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
                 "Cuda failure 'out of memory'"),
    RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`"),
    RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"),
    RuntimeError("Triton Error [CUDA]: CUDA_ERROR_OUT_OF_MEMORY"),
    RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB (GPU 0; 63.98 GiB total capacity)"),
    RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.02 GB, max allowed: "
                 "18.13 GB). Tried to allocate 256 bytes on private pool."),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to "
                 "allocate 1073741824 bytes."),
    MemoryError(),
]

NOT_OOM = [
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("CUDA error: device-side assert triggered"),
    RuntimeError("out of resource: shared memory, Required: 98304, Hardware limit: 65536. Reducing block sizes or "
                 "`num_stages` may help."),
    RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k, "
                 "&falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, compute_type, "
                 "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous "
                 "input."),
    ValueError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"),
]


@pytest.mark.parametrize("err", OOM, ids=lambda e: (str(e) or type(e).__name__)[:40])
def test_real_out_of_memory_messages_are_out_of_memory(err):
    assert is_oom(err)


@pytest.mark.parametrize("err", NOT_OOM, ids=lambda e: str(e)[:40])
def test_other_device_errors_are_not(err):
    assert not is_oom(err)


def test_the_cpu_allocator_failure_as_raised_here():
    with pytest.raises(Exception) as e:
        torch.empty(2**48, dtype=torch.uint8)  # 256 TiB: more than any address space gives
    assert "can't allocate memory" in str(e.value) or isinstance(e.value, torch.OutOfMemoryError)
    assert is_oom(e.value)


def test_an_explained_oom_is_not_retried_even_with_the_oom_as_its_cause():
    try:
        try:
            raise OOM[0]
        except RuntimeError as e:
            raise DeviceOutOfMemory("out of memory even at batch 1 (block)") from e
    except DeviceOutOfMemory as explained:
        assert not is_oom(explained)
    assert not is_oom(ValueError("out of memory"))  # only runtime errors speak for a device


def test_a_wrapped_oom_is_oom_but_an_error_raised_while_handling_one_is_not():
    try:
        try:
            raise OOM[1]
        except RuntimeError as inner:
            raise RuntimeError("BackendCompilerFailed: backend='inductor' raised an error") from inner
    except RuntimeError as outer:
        assert is_oom(outer)
    try:
        try:
            raise OOM[0]
        except RuntimeError:
            raise ValueError("a bug in the handler")  # noqa: B904  (the implicit context is the point)
    except ValueError as other:
        assert not is_oom(other)


def test_batch_controller_halves_on_a_cublas_allocation_failure():
    def fault(rows, where):
        if rows > 2:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    bc = BatchController(8, fault=fault)
    out = bc.run(lambda x: x + 1, torch.arange(10.0))
    assert torch.equal(out, torch.arange(10.0) + 1) and [r["to"] for r in bc.retries] == [4, 2]
    with pytest.raises(DeviceOutOfMemory, match="CUBLAS_STATUS_ALLOC_FAILED"):
        BatchController(1, fault=lambda rows, where: fault(9, where)).run(lambda x: x, torch.ones(1))


def test_a_sweep_recovers_from_cublas_and_cpu_allocator_failures(stories, cache_dir):
    c = Contract(pairs="all", prompts=8, tokens=12)  # block calls of 8 rows: 8 -> 4 -> 2 -> 1
    clean = score(stories, c, use_cache=False, engine_kw={"max_rows": 16})
    state = {"n": 0}
    messages = [OOM[1], OOM[12], OOM[3]]

    def fault(rows, where):
        if where == "block" and rows > 1 and state["n"] < len(messages):
            state["n"] += 1
            raise messages[state["n"] - 1]

    with pytest.warns(UserWarning, match="out of memory in block"):
        res = score(stories, c, use_cache=False, engine_kw={"max_rows": 16, "fault": fault})
    assert state["n"] == 3 and [r["where"] for r in res.meta["engine"]["oom_retries"]] == ["block"] * 3
    np.testing.assert_allclose(res.interchange(), clean.interchange(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(res.replacement_directed(), clean.replacement_directed(), atol=1e-6, rtol=0)


def test_the_controller_halves_a_group_and_refuses_to_halve_one_item():
    from swapkl.scoring.batching import BatchController, DeviceOutOfMemory

    seen = []
    bc = BatchController(8, on_retry=seen.append)
    assert bc.halve_group(5) == 2 and bc.halve_group(2) == 1
    assert bc.retries == seen == [{"where": "live", "from": 5, "to": 2}, {"where": "live", "from": 2, "to": 1}]
    with pytest.raises(DeviceOutOfMemory, match="one item alive"):
        bc.halve_group(1)
    assert bc.max_rows == 8  # the rows per call are the caller's to restore, never changed here
