"""Waterwave's node-group pipeline (seed 004 §4.3-4.4).

* ``partition``: a job's step graph -> continuous node groups (ANG / DNG). Pure.
* ``schedule``: Algorithm 1, pairing the groups of all jobs into two streams. Pure.
* ``rewrite``: reads a traced FuncGraph, inserts TensileNodeGroupBarrier ops.
* ``device_pipeline()``: the C++ runtime (CounterBarriers, counter_barrier.h)
  that those ops call; ``install_schedule`` hands it a PairSchedule.
"""
from __future__ import annotations

from tf_plugin.nodegroup.partition import ANG, DNG, GraphNode, NodeGroup, Partition, partition_graph
from tf_plugin.nodegroup.schedule import JobProfile, NodeGroupRef, PairSchedule, schedule_pairs


def device_pipeline():
    """The process-wide pipeline the barrier ops use (syncs the device pool)."""
    from tf_plugin import _plugin
    return _plugin.device_pipeline()


def install_schedule(schedule: PairSchedule, pipeline=None) -> int:
    """Installs ``schedule`` as a new version; returns the version number."""
    pipeline = pipeline or device_pipeline()
    jobs = {job: (schedule.names.get(job, str(job)), pairs) for job, pairs in schedule.pair_of_group.items()}
    return pipeline.set_schedule(jobs, schedule.num_pairs)


__all__ = ["ANG", "DNG", "GraphNode", "NodeGroup", "Partition", "partition_graph", "JobProfile",
           "NodeGroupRef", "PairSchedule", "schedule_pairs", "device_pipeline", "install_schedule"]
