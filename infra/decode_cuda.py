"""The decode loop on CUDA (infra/decode.py): the engine's own stream, and its decode step captured once as a
CUDA graph and replayed, one launch a step instead of one per kernel.

Why a stream of its own: a call runs on it, under the engine's device, after the work queued on the
caller's stream (a weight sync's copies) and before the caller's next (an update that frees memory the
call read) (`on_stream`); warm-up, capture and replay then share one stream, and the caller's stream is
current again however the call ends. Why not torch.cuda.graph: when a capture is invalidated, its exit
leaves the process on the capture stream with the allocator still routing into the graph's pool; `capture`
restores the stream on every path and gives a failed capture's pool back. A capture that fails costs its
call the graph, not the run (TorchEngine._try_capture).

`cuda` is torch.cuda; the tests pass a stand-in with the same few calls, since CUDA cannot run on their CPU.
Tests: python -m pytest tests/test_decode_cuda.py (the engine's retry: tests/test_decode.py -k capture); on CUDA,
bench/gpu_check.py
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def on_stream(stream, cuda=torch.cuda):
    """The block runs on `stream`, under its device, after the work queued so far on the caller's stream (a
    weight sync's copies) and before the caller's next (an update that frees memory the block read). The
    caller's stream is current again when the block ends, whatever it raised."""
    with cuda.device(stream.device):
        caller = cuda.current_stream()
        stream.wait_stream(caller)
        cuda.set_stream(stream)
        try:
            yield
        finally:
            cuda.set_stream(caller)
            caller.wait_stream(stream)


def capture(step, stream, cuda=torch.cuda):
    """`step` recorded as a CUDA graph on `stream`, the stream its warm-up steps ran on (so cuBLAS's workspace
    for that stream was made before, outside the graph's private pool). Does not use torch.cuda.graph: its
    __exit__ calls capture_end() before restoring the stream, and when the capture was invalidated (a sync
    inside the step, an allocation that failed) capture_end raises first, leaving the process on the capture
    stream and the allocator still routing that stream's allocations into the graph's pool. Here the caller's
    stream is current again on every path, and a failed capture's pool is given back (`_drop_pool`)."""
    graph, pool = cuda.CUDAGraph(), cuda.graph_pool_handle()
    cuda.synchronize()  # earlier work done, so that a capture failure is the step's own
    caller = cuda.current_stream()
    cuda.set_stream(stream)
    try:
        graph.capture_begin(pool=pool)
        try:
            step()
        except BaseException:
            with contextlib.suppress(RuntimeError):  # ends the stream's capture; raises if it was invalidated
                graph.capture_end()
            raise
        graph.capture_end()
    except BaseException:
        graph.reset()  # forgets the capture (and releases its pool if capture_end got that far)
        _drop_pool(pool, cuda)
        raise
    finally:
        cuda.set_stream(caller)
    return graph


def _drop_pool(pool, cuda) -> None:
    """What capture_end did not reach when it raised: the allocator stops routing allocations into the pool,
    and the pool is released. These two are torch's private bindings (torch.cuda.memory imports them for
    its MemPool); where they are missing the pool stays registered, as torch.cuda.graph leaves it."""
    end = getattr(cuda.memory, "_cuda_endAllocateToPool", None)
    release = getattr(cuda.memory, "_cuda_releasePool", None)
    if end is None or release is None:
        return
    device = cuda.current_device()
    try:
        end(device, pool)
    except RuntimeError:  # capture_end had ended it, and graph.reset() has released the pool
        return
    release(device, pool)

