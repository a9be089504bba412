"""The full-graph benchmark's harness, importable by every bench script and by the tests.

    timing      GPU timing (cuda_ms: wall time of synchronised calls; gpu_ms: CUDA-event time of
                calls run back to back), HBM and GPU-to-GPU copy bandwidths, rank-0 logging
    workloads   datasets ("name[:scale[:order]]", generated once and cached as .npz), the models
                of --models, the training step that is timed and the traffic it moves
    systems     epoch timing of mgg's model over a graph wrapper (CUDA graphs included) and of the
                baselines the harness runs itself (the plain torch model, PyG)
    floors      the aggregation floors: compulsory HBM bytes and the gather floor, the fastest bare
                gather-sum of a plan's own index stream (CUDA sources: bench/harness/*.cu)

bench/fullgraph.py is the script that puts them together.
"""
