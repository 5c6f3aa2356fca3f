"""ONNX Runtime profiles summed per provider and operator."""

from __future__ import annotations

from typing import Any

from nmt_tools.device.ort_profile import report, summarize


def node(op: str, provider: str, dur: int) -> dict[str, Any]:
    return {
        "cat": "Node",
        "name": f"n_{op}.node_kernel_time",
        "dur": dur,
        "args": {"op_name": op, "provider": provider},
    }


def test_runs_and_node_time_are_summed_per_provider_and_operator() -> None:
    run = [
        node("MatMul", "CUDAExecutionProvider", 30),
        node("Shape", "CPUExecutionProvider", 2),
        node("MemcpyToHost", "CUDAExecutionProvider", 68),
        # ONNX Runtime's before/after-run events of a node are not its kernel time.
        {"cat": "Node", "name": "n_MatMul.node_fence_before", "dur": 500, "args": {"op_name": "MatMul"}},
        {"cat": "Session", "name": "model_run", "dur": 110},
    ]
    summary = summarize(run * 4)
    assert summary.model_runs == 4 and summary.mean_run_ms() == 0.11
    assert summary.node_runs == {"CUDA": 8, "CPU": 4}
    assert summary.op_us[("CUDA", "MemcpyToHost")] == 272
    lines = report("decoder", summary, top=2)
    assert "node runs per model run by provider: CUDA 2, CPU 1" in lines[2]
    assert lines[-3:] == ["| CUDA | MemcpyToHost | 1.0 | 68.0 | 68.0% |", "| CUDA | MatMul | 1.0 | 30.0 | 30.0% |", ""]
