"""Profiling: read per-rank profiler traces (PyTorch/Kineto JSON, Nsight Systems SQLite), analyse
them with Holistic Trace Analysis' definitions plus cross-rank straggler detection, and turn the
tables into findings. Capture (wrapping the benchmark worker in nsys / torch.profiler) lives in
``capture.py``.
"""
