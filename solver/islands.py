"""GPU islands: the seed note's Algorithm 1 (similarity graph, then greedy merging).

Phase 1 links two nodes when their effective compute (bf16 TFLOP/s × perf), HBM capacity and HBM
bandwidth each differ by at most ``tau_c``/``tau_m``/``tau_b`` relative to the larger of the two;
islands start as connected components. Phase 2 merges island pairs, cheapest first, while the
merge cost (the estimated relative throughput loss of running the union at its weakest member) is
at most ``t_merge``. ``formulations.island_merge`` solves the phase-2 decision exactly with CP-SAT.
Nodes of two GPU vendors are never similar and never merged (:func:`same_vendor`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import networkx as nx

from solver.spec.domain import ClusterSpec, Island, Node, PlannerOptions


@dataclass(frozen=True)
class Thresholds:
    """Similarity and merge thresholds (relative differences, see :class:`PlannerOptions`)."""

    tau_c: float = 0.2
    tau_m: float = 0.2
    tau_b: float = 0.2
    t_merge: float = 0.1

    @classmethod
    def of(cls, opts: PlannerOptions) -> "Thresholds":
        """The thresholds of a job's planner options."""
        return cls(opts.tau_c, opts.tau_m, opts.tau_b, opts.t_merge)


@dataclass(frozen=True)
class Merge:
    """One phase-2 merge: the phase-1 components it joined, the final island, the loss."""

    members: tuple[str, ...]
    into: str
    loss: float


@dataclass(frozen=True)
class IslandSet:
    """Result of island construction.

    Attributes
    ----------
    islands : tuple[Island, ...]
        Final islands, strongest first.
    components : tuple[Island, ...]
        Phase-1 islands (after splitting chained components), named ``c<j>-<gpu>``.
    merges : tuple[Merge, ...]
        Phase-2 merges in the order they happened.
    """

    islands: tuple[Island, ...]
    components: tuple[Island, ...]
    merges: tuple[Merge, ...]


def node_key(node: Node) -> tuple:
    """Natural sort key of a node id (``a100-2`` before ``a100-10``)."""
    prefix, _, num = node.node_id.rpartition("-")
    return (prefix, int(num)) if num.isdigit() else (node.node_id, -1)


def _metrics(node: Node) -> tuple[float, float, float]:
    return (node.tflops, node.gpu.hbm_gb, node.gpu.hbm_bw_gbs)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(a, b)


def similar(a: Node, b: Node, th: Thresholds) -> bool:
    """Phase-1 edge test: the same vendor, and every metric within its threshold of the larger
    value (GPUs of two vendors never share an island: :func:`same_vendor`)."""
    if not same_vendor((a, b)):
        return False
    (ca, ma, ba), (cb, mb, bb) = _metrics(a), _metrics(b)
    return _rel(ca, cb) <= th.tau_c and _rel(ma, mb) <= th.tau_m and _rel(ba, bb) <= th.tau_b


def similarity_graph(nodes: tuple[Node, ...], th: Thresholds) -> nx.Graph:
    """Graph over nodes with an edge between similar nodes.

    Identical nodes (same kind) are joined by a path rather than a clique, and kinds are compared
    once through a representative: the connected components are those of the full graph, at
    O(nodes + kinds²) cost instead of O(nodes²).
    """
    graph = nx.Graph()
    graph.add_nodes_from(n.node_id for n in nodes)
    first: dict[tuple, Node] = {}
    last: dict[tuple, Node] = {}
    for node in nodes:
        if node.kind in last:
            graph.add_edge(last[node.kind].node_id, node.node_id)
        first.setdefault(node.kind, node)
        last[node.kind] = node
    reps = list(first.values())
    for i, a in enumerate(reps):
        for b in reps[i + 1:]:
            if similar(a, b, th):
                graph.add_edge(a.node_id, b.node_id)
    return graph


def _spread_ok(group: list[Node], th: Thresholds) -> bool:
    cols = list(zip(*(_metrics(n) for n in group)))
    taus = (th.tau_c, th.tau_m, th.tau_b)
    return all((max(c) - min(c)) / max(c) <= t for c, t in zip(cols, taus))


def split_chain(members: list[Node], th: Thresholds) -> list[list[Node]]:
    """Split a component whose extremes differ by more than the thresholds.

    Connected components are transitive: A~B and B~C put A and C together even when they differ
    by up to twice the threshold, and a long chain of small steps can join very different GPUs.
    We keep a component only when its extremes are within the thresholds; otherwise we sweep its
    node kinds from strongest to weakest and start a new island whenever adding a kind would
    stretch the island's spread beyond a threshold. Every resulting island is then pairwise
    similar (a clique of the similarity graph).
    """
    if _spread_ok(members, th):
        return [members]
    by_kind: dict[tuple, list[Node]] = {}
    for n in sorted(members, key=lambda n: (-n.tflops, -n.gpu.hbm_gb, -n.gpu.hbm_bw_gbs, n.node_id)):
        by_kind.setdefault(n.kind, []).append(n)
    groups: list[list[Node]] = []
    for kind_nodes in by_kind.values():
        if groups and _spread_ok(groups[-1] + kind_nodes[:1], th):
            groups[-1].extend(kind_nodes)
        else:
            groups.append(list(kind_nodes))
    return groups


def merge_loss(a: Island, b: Island) -> float:
    """Estimated relative throughput loss of running ``a ∪ b`` at its weakest member.

    The union runs every GPU at the slowest member's compute and plans with the smallest HBM.
    We take the larger of the two losses: compute lost, ``1 − N·c_min / Σ nᵢcᵢ``, and memory
    capacity lost, ``1 − N·m_min / Σ nᵢmᵢ`` (capacity lost forces recomputation or sharding,
    which costs throughput in proportion, to first order).
    """
    nodes = a.nodes + b.nodes
    if not same_vendor(nodes):
        return math.inf
    n = sum(x.gpus for x in nodes)
    compute = 1 - n * min(x.tflops for x in nodes) / sum(x.gpus * x.tflops for x in nodes)
    memory = 1 - n * min(x.gpu.hbm_gb for x in nodes) / sum(x.gpus * x.gpu.hbm_gb for x in nodes)
    return max(compute, memory, 0.0)


def same_vendor(nodes) -> bool:
    """Whether ``nodes`` are all of one GPU vendor. An island is a candidate mesh, and one mesh
    is one communicator: NCCL and RCCL cannot form one (the rule and its citation:
    :func:`solver.cost.runtime.runtime_rules.vendor_problem`), so merging never joins two vendors."""
    return len({n.gpu.vendor for n in nodes}) <= 1


def vendors(cluster: ClusterSpec) -> tuple[str, ...]:
    """The GPU vendors of ``cluster``'s nodes, in node order."""
    return tuple(dict.fromkeys(n.gpu.vendor for n in cluster.nodes))


def vendor_cluster(cluster: ClusterSpec, vendor: str, keep=None) -> ClusterSpec | None:
    """``cluster`` with only the node groups of ``vendor``'s GPUs (and, with ``keep``, whose
    GPU type passes ``keep``); None when no group is left."""
    groups = tuple(g for g in cluster.groups
                   if g.gpu.vendor == vendor and (keep is None or keep(g.gpu)))
    return replace(cluster, name=f"{cluster.name} ({vendor})", groups=groups) if groups else None


def whole_cluster_views(cluster: ClusterSpec, keep=None) -> tuple[IslandSet, ...]:
    """The heterogeneity-oblivious views: the whole cluster as one island, or, where it mixes
    GPU vendors, one such island per vendor (one mesh is one communicator); with ``keep``, of
    the GPU types that pass it only (those that run the job's precision)."""
    found = vendors(cluster)
    if len(found) <= 1 and keep is None:
        return (whole_cluster(cluster),)
    parts = (vendor_cluster(cluster, v, keep) for v in found)
    return tuple(whole_cluster(c) for c in parts if c is not None)


def _order_key(island: Island) -> tuple:
    return (-island.tflops_per_gpu, -island.hbm_gb, island.nodes[0].node_id)


def phase1(cluster: ClusterSpec, th: Thresholds) -> tuple[Island, ...]:
    """Initial islands: connected components of the similarity graph, chains split."""
    nodes = cluster.nodes
    by_id = {n.node_id: n for n in nodes}
    graph = similarity_graph(nodes, th)
    groups: list[list[Node]] = []
    for comp in nx.connected_components(graph):
        members = sorted((by_id[i] for i in comp), key=node_key)
        groups.extend(split_chain(members, th))
    islands = sorted((Island("", tuple(g)) for g in groups), key=_order_key)
    return tuple(Island(f"c{j}-{isl.gpu.name}", isl.nodes) for j, isl in enumerate(islands))


def greedy_merge(components: tuple[Island, ...], th: Thresholds) -> list[tuple[Island, tuple[str, ...], float]]:
    """Phase 2: merge the cheapest pair while its cost is at most ``t_merge``.

    Returns the final groups as (island, phase-1 member names, loss of its last merge); a lazy
    priority queue skips pairs whose members were merged away since they were queued.
    """
    alive: dict[int, tuple[Island, tuple[str, ...], float]] = {
        i: (c, (c.name,), 0.0) for i, c in enumerate(components)}
    heap = [(merge_loss(alive[i][0], alive[j][0]), i, j)
            for i in alive for j in alive if i < j]
    heapq.heapify(heap)
    next_id = len(components)
    while heap:
        loss, i, j = heapq.heappop(heap)
        if loss > th.t_merge:
            break
        if i not in alive or j not in alive:
            continue
        (a, ma, _), (b, mb, _) = alive.pop(i), alive.pop(j)
        merged = Island("", a.nodes + b.nodes)
        for k, (other, _, _) in alive.items():
            heapq.heappush(heap, (merge_loss(merged, other), k, next_id))
        alive[next_id] = (merged, tuple(sorted(ma + mb)), loss)
        next_id += 1
    return list(alive.values())


def build_islands(cluster: ClusterSpec, th: Thresholds | None = None) -> IslandSet:
    """Algorithm 1: phase-1 components, then greedy merging; islands named ``i<k>-<gpu>``."""
    th = th or Thresholds()
    components = phase1(cluster, th)
    groups = sorted(greedy_merge(components, th), key=lambda g: _order_key(g[0]))
    islands, merges = [], []
    for k, (isl, members, loss) in enumerate(groups):
        final = Island(f"i{k}-{isl.gpu.name}", tuple(sorted(isl.nodes, key=node_key)))
        islands.append(final)
        if len(members) > 1:
            merges.append(Merge(members, final.name, merge_loss_of(final.nodes)))
    return IslandSet(tuple(islands), components, tuple(merges))


def merge_loss_of(nodes: tuple[Node, ...]) -> float:
    """Throughput loss of running ``nodes`` as one island (0 for identical nodes)."""
    if len(nodes) < 2:
        return 0.0
    return merge_loss(Island("", nodes[:1]), Island("", nodes[1:]))


def partition_loss(groups: list[tuple[Node, ...]]) -> float:
    """Cluster-wide fraction of compute lost by running each group at its weakest member."""
    total = sum(n.gpus * n.tflops for g in groups for n in g)
    kept = sum(sum(n.gpus for n in g) * min(n.tflops for n in g) for g in groups)
    return 1 - kept / total


def whole_cluster(cluster: ClusterSpec) -> IslandSet:
    """The whole cluster as one island at its weakest members' values (no merge recorded): the
    view of a heterogeneity-oblivious planner, which the planner also tries."""
    nodes = tuple(sorted(cluster.nodes, key=node_key))
    island = Island(f"all-{Island('', nodes).gpu.name}", nodes)
    return IslandSet((island,), (island,), ())


def weakest_node(island: Island) -> Node:
    """One node with the island's effective (weakest-member) figures.

    Every node of an island is planned at these values, so any group of its nodes can run any
    partial plan made for a group of that size (the seed note, Algorithm 1).
    """
    return island.effective_node


def group_island(island: Island, nodes: int) -> Island:
    """``nodes`` nodes of ``island`` at its effective figures: what a stage group is planned on
    (its nodes are built once per island: the planner asks for groups of every size often)."""
    if not 0 < nodes <= len(island.nodes):
        raise ValueError(f"a group of {nodes} nodes of {island.name} ({len(island.nodes)} nodes)")
    return Island(island.name, island.effective_nodes[:nodes])
