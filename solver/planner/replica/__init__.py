"""The pipeline-replica search (opt-in, ``[planner] replicas = true``).

Takes the single-pipeline search's tables and a JobSpec; hands on a ReplicaPlan (several
pipelines with their batch shares) and which runtime could train it.
"""
