"""TENSILE planner (seeds 000/001), pure: graphs and latencies in, a ``Plan`` out.

No TensorFlow import and no threads anywhere in this package. Pipeline, in the
seed's order: job_graph -> access_sequence (§IV-A) -> peak_analysis
(Algorithm 1) -> swap_scheduling (Algorithm 2) -> recompute (§IV-D) ->
planner (Algorithm 3) -> plan.
"""
from tensile_tf.scheduler.access_sequence import TensorAccess, TensorAccessSequence
from tensile_tf.scheduler.job_graph import GraphBuilder, JobGraph, OpNode, TensorInfo
from tensile_tf.scheduler.latency import ColdStartLatency, LatencyModel, LatencyTable, UniformLatency
from tensile_tf.scheduler.peak_analysis import JobFootprint, PeakAnalysis, PoolTimeline, gpu_memory_peak_analysis
from tensile_tf.scheduler.plan import JobPlan, Plan, RecomputeEvent, ReleaseEvent, SwapEvent
from tensile_tf.scheduler.planner import DEFAULT_BANDWIDTH_BYTES_PER_S, Planner, PlannerJob, plan_graphs
from tensile_tf.scheduler.swap_channel import SwapChannel

__all__ = [
    "ColdStartLatency", "DEFAULT_BANDWIDTH_BYTES_PER_S", "GraphBuilder", "JobFootprint", "JobGraph", "JobPlan", "LatencyModel",
    "LatencyTable", "OpNode", "PeakAnalysis", "Plan", "Planner", "PlannerJob", "PoolTimeline", "RecomputeEvent",
    "ReleaseEvent", "SwapChannel", "SwapEvent", "TensorAccess", "TensorAccessSequence", "TensorInfo",
    "UniformLatency", "gpu_memory_peak_analysis", "plan_graphs",
]
