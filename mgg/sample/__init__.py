"""Sampled mini-batch training: neighbor sampling, Fused-Map, feature tiers, Match-Reorder.

Layering: imports mgg.data, mgg.runtime and mgg.kernels only (CUDA paths lazily, from
mgg.kernels.sample_gpu). See docs/sampling.md.

    from mgg.sample import NeighborLoader, make_feature_source
    feats = make_feature_source(x, store, bounds, comm, budget_bytes)     # collective
    loader = NeighborLoader((indptr, indices), feats, y, train_idx,       # all ranks' training nodes
                            fanouts=[25, 10], batch_size=1024, reorder=True, comm=comm)
    for batch in loader:            # SampledBatch: n_id, blocks, x, y, seeds, byte counters
        logits = model(batch.x, batch.blocks)
"""
from .batching import BatchPlan, epoch_order
from .block import Block, SampledBatch
from .features import (FEATURE_TIERS, FeatureSource, FetchStats, HostTierFeatures, StoreFeatures, TensorFeatures,
                       choose_feature_source, make_feature_source, parse_size)
from .idmap import IdMap, build_id_map, fused_map, unique_map
from .loader import EpochStats, NeighborLoader, sample_blocks
from .neighbor import KEYS_FACTOR, check_fanouts, place_adjacency, sample_edge_positions, sample_neighbors
from .reorder import ResidentCache, fetch_cost, match_reorder, overlap_matrix, overlap_matrix_torch

__all__ = ["Block", "SampledBatch", "FeatureSource", "FetchStats", "StoreFeatures", "HostTierFeatures",
           "TensorFeatures", "choose_feature_source", "make_feature_source", "parse_size", "FEATURE_TIERS",
           "IdMap", "build_id_map", "fused_map", "unique_map", "NeighborLoader", "EpochStats", "BatchPlan",
           "epoch_order", "sample_blocks", "sample_neighbors", "sample_edge_positions", "check_fanouts",
           "place_adjacency", "KEYS_FACTOR",
           "ResidentCache", "match_reorder", "overlap_matrix", "overlap_matrix_torch", "fetch_cost"]
