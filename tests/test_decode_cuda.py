"""infra/decode_cuda.py's handling of CUDA's stream and graph capture, on the CPU: against a stand-in for
torch.cuda's few calls (FakeCuda), since CUDA cannot run here. On a GPU, bench/gpu_check.py runs the same
against torch.cuda itself. The engine's retry of a failed capture is in tests/test_decode.py."""
import contextlib
import types

import pytest
import torch

from infra import decode_cuda


class FakeStream:
    def __init__(self, name):
        self.name, self.device, self.waited_for = name, torch.device("cuda", 0), []

    def wait_stream(self, other):
        self.waited_for.append(other.name)


class FakeGraph:
    """CUDAGraph's rules that matter here: capture_end must run on the capture stream; a capture invalidated
    (by a sync inside it) makes capture_end raise before it stops routing allocations into the pool."""

    def __init__(self, cuda):
        self.cuda, self.reset_done, self.stream = cuda, False, None

    def capture_begin(self, pool):
        self.stream, self.pool = self.cuda.current, pool
        self.cuda.capturing, self.cuda.routed, self.cuda.invalidated = self, pool, False

    def capture_end(self):
        if self.cuda.current is not self.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        self.cuda.capturing = None
        if self.cuda.invalidated:
            raise RuntimeError("operation failed due to a previous error during capture")
        self.cuda.routed = None

    def reset(self):
        self.reset_done = True


class FakeCuda:
    """torch.cuda's few calls that decode_cuda.capture and decode_cuda.on_stream make (CUDA cannot run here)."""

    def __init__(self):
        self.current, self.capturing, self.routed, self.invalidated = FakeStream("caller"), None, None, False
        self.released = []
        self.memory = types.SimpleNamespace(_cuda_endAllocateToPool=self.end_pool, _cuda_releasePool=self.release_pool)

    def sync(self):  # what a step's .item() does: inside a capture it invalidates the capture
        if self.capturing:
            self.invalidated = True
            raise RuntimeError("operation not permitted when stream is capturing")

    def end_pool(self, device, pool):
        if self.routed != pool:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.routed = None

    def release_pool(self, device, pool):
        self.released.append(pool)

    def current_stream(self):
        return self.current

    def set_stream(self, stream):
        self.current = stream

    def device(self, device):
        return contextlib.nullcontext()

    def synchronize(self):
        pass

    def current_device(self):
        return 0

    def graph_pool_handle(self):
        return (0, 7)

    def CUDAGraph(self):  # noqa: N802 (torch.cuda's name)
        self.graph = FakeGraph(self)
        return self.graph


def test_a_failed_capture_leaves_the_callers_stream_current_and_gives_its_pool_back():
    cuda, side = FakeCuda(), FakeStream("engine")
    with pytest.raises(RuntimeError, match="not permitted"):
        decode_cuda.capture(cuda.sync, side, cuda)
    # torch.cuda.graph's __exit__ would have left `side` current and the pool taking its allocations
    assert cuda.current.name == "caller" and cuda.capturing is None
    assert cuda.routed is None and cuda.released == [(0, 7)] and cuda.graph.reset_done
    ran_on = []
    graph = decode_cuda.capture(lambda: ran_on.append(cuda.current.name), side, cuda)  # and a later capture works
    assert ran_on == ["engine"] and cuda.current.name == "caller" and graph is cuda.graph
    assert cuda.routed is None and cuda.released == [(0, 7)]  # a captured graph keeps its pool


def test_a_call_on_the_engines_stream_is_ordered_and_gives_the_callers_stream_back():
    cuda, side = FakeCuda(), FakeStream("engine")
    caller = cuda.current
    with pytest.raises(ValueError), decode_cuda.on_stream(side, cuda):
        assert cuda.current is side
        raise ValueError("a failure inside the call")
    assert cuda.current is caller
    assert side.waited_for == ["caller"] and caller.waited_for == ["engine"]
