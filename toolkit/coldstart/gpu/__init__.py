"""The GPU verification kit: CUDA driver checkpoints, a process that holds GPU memory, the GPU tests'
helpers, run with the GPU benchmarks by ``scripts/gpu-check`` (coldstart.bench.gpu_check) on a bare
CUDA machine (docs/gpu.md).

Nothing here is imported by a pipeline stage; it sits on top like the benchmarks, and it imports
only the standard library at module level so that it runs where coldstart's dependencies are absent.
"""
