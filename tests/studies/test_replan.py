"""Re-planning with the partial-plan cache: keys, persistence, call counts, equality with a fresh plan.

The call counts are checked against an independent recount: a recording parallelizer lists the
(slice, island, context) calls of fresh plans of the old and the changed cluster, and a replan
must call the inner parallelizer exactly for the calls the old plan did not make.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import pytest

from solver.cli.main import main
from solver.cli.report import island_json
from solver.cost.parallelizer import AnalyticParallelizer, PlanContext
from solver.cost.stage import ModelSlice
from solver.planner.stages.interleaved import chunk_options, interleaved_depths
from solver.planner.plan import plan_json
from solver.planner.stages.plancache import (
    CACHE_FORMAT,
    CacheKey,
    CachingParallelizer,
    DirectoryStore,
    MemoryStore,
    cache_key,
    code_fingerprint,
    plan_from_row,
    plan_to_row,
)
from solver.planner.pruning import Rule
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.spec.domain import FeaturePreset, Island
from solver.spec.errors import InputError
from solver.spec.loaders import INSTANCES, load_job, load_model
from solver.studies.replan import ClusterChange, apply_change, load_added_nodes, replan

JOB = """model = "llama2-7b"
[cluster]
name = "pair"
inter_island_gbits = 200.0
{groups}
[training]
global_batch = 32
seq_len = 2048
n_micro = 8
"""
GROUP = """[[cluster.nodes]]
gpu = "{gpu}"
count = {count}
name = "{name}"
"""
BASE = [("H100-SXM-80GB", 2, "h100"), ("A100-SXM-80GB", 2, "a100")]
# Rules that do not depend on other islands; the whole-cluster alternative is off so that calls
# are counted per island.
LOCAL = PlannerConfig(rules=Rule.DEDUPE | Rule.MEMORY, whole_cluster=False)


def write_job(tmp_path, groups, name="job.toml"):
    text = JOB.format(groups="".join(GROUP.format(gpu=g, count=c, name=n) for g, c, n in groups))
    path = tmp_path / name
    path.write_text(text)
    return path


@dataclass
class Recorder:
    """Analytic parallelizer that records every call's cache key text (island signature inc.)."""

    inner: AnalyticParallelizer = field(default_factory=AnalyticParallelizer)
    calls: list = field(default_factory=list)

    interleaving_priced_above_plain = True  # its answers are the analytic model's

    @property
    def kernel_calibration(self):
        return self.inner.calibration  # so its floors are the analytic model's as well

    @property
    def stage_calibration(self):
        return self.inner.calibration  # and its stage options the cost model's (the same cuts)

    def plan(self, slice, island, context):
        self.calls.append((island.gpu.name, cache_key(slice, island, context, "", "").text))
        return self.inner.plan(slice, island, context)

    def plan_stages(self, model, lengths, has_embedding, has_head, island, context):
        for d in lengths:
            key = cache_key(ModelSlice(model, d, has_embedding, has_head), island, context, "", "")
            self.calls.append((island.gpu.name, key.text))
        return self.inner.plan_stages(model, lengths, has_embedding, has_head, island, context)


def payload_of(plan):
    return json.loads(json.dumps(plan_json(plan, [island_json(i) for i in plan.islands.islands])))


def stages_of(plan):
    return [(s.island.name, s.start, s.end, s.plan.config) for s in plan.stages]


@pytest.fixture
def h100(catalog):
    return Island.homogeneous("h", catalog["H100-SXM-80GB"], 16)


# --- the cache ------------------------------------------------------------------------------

def _call(h100, **ctx):
    model = load_model(INSTANCES / "models" / "llama2-7b.toml")
    base = dict(seq_len=2048, micro_batch=4, n_micro=8, in_flight=2, epsilon=0.1)
    return ModelSlice(model, 8, True, False), h100, PlanContext(**{**base, **ctx})


def test_partial_plan_json_round_trip_is_exact(h100):
    plans = AnalyticParallelizer().plan(*_call(h100))
    assert plans
    back = [plan_from_row(json.loads(json.dumps(plan_to_row(p)))) for p in plans]
    assert back == plans  # floats written with repr round-trip bit for bit


def test_second_call_hits_and_returns_the_same_plans(h100):
    cached = CachingParallelizer(AnalyticParallelizer(), MemoryStore())
    first = cached.plan(*_call(h100))
    second = cached.plan(*_call(h100))
    assert second == first == AnalyticParallelizer().plan(*_call(h100))
    assert (cached.inner_calls, cached.hits) == (1, 1)


@pytest.mark.parametrize("change", [dict(epsilon=0.2), dict(in_flight=3), dict(micro_batch=8),
                                    dict(n_micro=16), dict(seq_len=4096),
                                    dict(features=FeaturePreset.METIS)])
def test_any_changed_context_field_misses(h100, change):
    cached = CachingParallelizer(AnalyticParallelizer(), MemoryStore())
    cached.plan(*_call(h100))
    slc, isl, ctx = _call(h100, **change)
    assert cached.plan(slc, isl, ctx) == AnalyticParallelizer().plan(slc, isl, ctx)
    assert (cached.inner_calls, cached.hits) == (2, 0)


def test_changed_island_slice_or_parallelizer_misses(h100, catalog):
    store = MemoryStore()
    cached = CachingParallelizer(AnalyticParallelizer(), store)
    slc, isl, ctx = _call(h100)
    cached.plan(slc, isl, ctx)
    slower = Island.homogeneous("h", catalog["H100-SXM-80GB"], 16, perf=0.9)
    fewer = Island.homogeneous("h", catalog["H100-SXM-80GB"], 8)
    renamed = Island.homogeneous("other-name", catalog["H100-SXM-80GB"], 16)
    for args in [(slc, slower, ctx), (slc, fewer, ctx), (replace(slc, layers=9), isl, ctx),
                 (replace(slc, has_head=True), isl, ctx)]:
        cached.plan(*args)
    cached.plan(slc, renamed, ctx)  # the island's name is not part of what a plan depends on
    assert (cached.inner_calls, cached.hits) == (5, 1)
    other = CachingParallelizer(AnalyticParallelizer(FeaturePreset.ALPA), store)
    other.plan(slc, isl, ctx)
    assert other.inner_calls == 1  # another parallelizer's entries are not reused


def test_key_includes_cost_model_code(h100):
    slc, isl, ctx = _call(h100)
    a = cache_key(slc, isl, ctx, "p", code_fingerprint())
    b = cache_key(slc, isl, ctx, "p", code_fingerprint(("solver.cost.parallelizer",)))
    assert a.digest != b.digest and len(a.digest) == 64
    assert a == CacheKey.of(json.loads(a.text))  # canonical: re-serializing gives the same key


def test_key_includes_the_catalogs_kernel_figures(h100, catalog):
    # An edited catalog entry (same GPU name) must not return the old entry's plans.
    slc, isl, ctx = _call(h100)
    base = cache_key(slc, isl, ctx, "p", "c")
    gpu = catalog["H100-SXM-80GB"]
    assert cache_key(slc, Island.homogeneous("h", gpu, 16), ctx, "p", "c") == base
    for edit in ({"gemm_eff": 0.7}, {"gemm_half_balance": 0.5}, {"gemm_latency_us": 9.0},
                 {"attention_eff": 0.4}):
        other = Island.homogeneous("h", replace(gpu, **edit), 16)
        assert cache_key(slc, other, ctx, "p", "c").digest != base.digest, edit


def test_key_hashes_every_module_the_parallelizer_runs():
    # A module that decides a partial plan but is not hashed would let an edit return stale
    # entries: follow the cost package's imports (lazy ones too) from the parallelizer.
    import ast
    import importlib

    from solver.planner.stages.plancache import COST_MODEL_MODULES
    seen, todo = set(), ["solver.cost.parallelizer"]
    while todo:
        name = todo.pop()
        seen.add(name)
        tree = ast.parse(open(importlib.import_module(name).__file__).read())
        todo += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and (n.module or "").startswith("solver.cost.") and n.module not in seen]
    assert seen <= set(COST_MODEL_MODULES), sorted(seen - set(COST_MODEL_MODULES))


def test_directory_store_persists_and_ignores_damage(h100, tmp_path):
    call = _call(h100)
    first = CachingParallelizer(AnalyticParallelizer(), DirectoryStore(tmp_path))
    expected = first.plan(*call)
    files = list(tmp_path.glob(f"v{CACHE_FORMAT}/*/*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["format"] == CACHE_FORMAT
    again = CachingParallelizer(AnalyticParallelizer(), DirectoryStore(tmp_path))
    assert again.plan(*call) == expected and (again.inner_calls, again.hits) == (0, 1)
    files[0].write_text("{not json")
    broken = CachingParallelizer(AnalyticParallelizer(), DirectoryStore(tmp_path))
    assert broken.plan(*call) == expected and broken.inner_calls == 1  # miss, rewritten
    data = json.loads(files[0].read_text())
    data["key"]["context"]["epsilon"] = 0.3  # an entry whose stored key differs is not used
    files[0].write_text(json.dumps(data))
    tampered = CachingParallelizer(AnalyticParallelizer(), DirectoryStore(tmp_path))
    assert tampered.plan(*call) == expected and tampered.inner_calls == 1


# --- replanning -----------------------------------------------------------------------------

def _warm(job, store, config):
    plan = plan_job(job, config, parallelizer=CachingParallelizer(AnalyticParallelizer(), store))
    return plan, payload_of(plan)


def _fresh(job, config):
    rec = Recorder()
    return plan_job(job, config, parallelizer=rec), rec.calls


def _interleaved_family(key: dict, job) -> bool:
    """A call of the interleaved family: the whole model, priced interleaved, or its plain
    1F1B probe over the depths Megatron could interleave (planner.interleaved.plain_floor)."""
    ctx, whole = key["context"], key["slice"]["layers"] == job.model.layers
    deepest = max((max(d) for v in chunk_options(job) if v > 1
                   if (d := interleaved_depths(job, ctx["n_micro"], v))), default=0)
    return whole and (ctx["schedule"] == "interleaved" or ctx["max_pp"] == deepest)


def test_failing_one_node_replans_only_that_island(tmp_path):
    # Rules 1 and 3 only. A stage is a group of nodes planned at its island's figures, so after
    # a failure every group the smaller island can form was already planned: no new call for
    # the node-group composition. The interleaved family is cut by the incumbent, which moves
    # with the cluster: it may ask for groups the old plan's cut skipped, and only those.
    job = load_job(write_job(tmp_path, BASE))
    old_plan, old_calls = _fresh(job, LOCAL)
    store = MemoryStore()
    _, payload = _warm(job, store, LOCAL)
    r = replan(job, payload, ClusterChange(("a100-1",)), CachingParallelizer(
        AnalyticParallelizer(), store), LOCAL)
    fresh, calls = _fresh(load_job(write_job(tmp_path, [BASE[0], ("A100-SXM-80GB", 1, "a100")],
                                             "changed.toml")), LOCAL)
    expected = {k for _, k in calls} - {k for _, k in old_calls}
    assert r.parallelizer_calls == len(expected)
    assert all(_interleaved_family(json.loads(k), job) for k in expected)
    assert r.cache_hits == len(calls) - len(expected)
    assert r.plan.iteration_time_s == fresh.iteration_time_s
    assert stages_of(r.plan) == stages_of(fresh)
    assert [n.node_id for n in r.plan.islands.islands[1].nodes] == ["a100-0"]


def test_replan_calls_are_the_new_entries_under_the_paper_rules(tmp_path):
    # Rule 2's windows move with the cluster's compute, so unchanged islands may need a few new
    # lengths: the replan must call exactly for the entries the old plan never asked for.
    config = PlannerConfig()
    job = load_job(write_job(tmp_path, BASE))
    old_plan, old_calls = _fresh(job, config)
    store = MemoryStore()
    _, payload = _warm(job, store, config)
    r = replan(job, payload, ClusterChange(("h100-0",)),
               CachingParallelizer(AnalyticParallelizer(), store), config)
    fresh, new_calls = _fresh(load_job(write_job(
        tmp_path, [("H100-SXM-80GB", 1, "h100"), BASE[1]], "changed.toml")), config)
    expected = {k for _, k in new_calls} - {k for _, k in old_calls}
    assert r.parallelizer_calls == len(expected)
    assert r.parallelizer_calls < len(new_calls)
    assert r.previous.iteration_time_s == pytest.approx(old_plan.iteration_time_s, rel=1e-12)
    assert (r.plan.iteration_time_s, stages_of(r.plan)) == (fresh.iteration_time_s,
                                                            stages_of(fresh))
    assert r.change == pytest.approx(fresh.tokens_per_s / old_plan.tokens_per_s - 1)


def test_added_nodes_equal_a_fresh_plan_of_the_bigger_cluster(tmp_path):
    job = load_job(write_job(tmp_path, BASE))
    nodes = tmp_path / "nodes.toml"
    nodes.write_text('[[nodes]]\ngpu = "H100-SXM-80GB"\ncount = 1\nname = "h100new"\n')
    store = MemoryStore()
    _, payload = _warm(job, store, LOCAL)
    r = replan(job, payload, ClusterChange((), load_added_nodes(nodes)),
               CachingParallelizer(AnalyticParallelizer(), store), LOCAL)
    fresh, calls = _fresh(load_job(write_job(
        tmp_path, BASE + [("H100-SXM-80GB", 1, "h100new")], "bigger.toml")), LOCAL)
    assert (r.plan.iteration_time_s, stages_of(r.plan)) == (fresh.iteration_time_s,
                                                            stages_of(fresh))
    assert r.plan.islands.islands[0].gpus == 24  # the new H100 node joined the H100 island
    _, old_calls = _fresh(job, LOCAL)
    assert r.parallelizer_calls == len({k for _, k in calls} - {k for _, k in old_calls})


def test_change_errors(tmp_path):
    job = load_job(write_job(tmp_path, BASE))
    with pytest.raises(InputError, match="unknown node 'a100-7'"):
        apply_change(job.cluster, ClusterChange(("a100-7",)))
    with pytest.raises(InputError, match="no node would be left"):
        apply_change(job.cluster, ClusterChange(("a100-0", "a100-1", "h100-0", "h100-1")))
    once = apply_change(job.cluster, ClusterChange(("a100-0",)))
    assert [n.node_id for n in once.nodes] == ["h100-0", "h100-1", "a100-1"]
    assert once.total_gpus == 24
    with pytest.raises(InputError, match="unknown node 'a100-0'"):
        apply_change(once, ClusterChange(("a100-0",)))  # already out of service


# --- the command ----------------------------------------------------------------------------

@pytest.fixture
def planned(tmp_path, capsys):
    job = write_job(tmp_path, BASE)
    assert main(["plan", str(job), "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    return job, plan


def test_cli_replan_json(planned, tmp_path, capsys):
    job, plan = planned
    cache = tmp_path / "cache"
    argv = ["replan", str(plan), "--job", str(job), "--fail", "a100-1", "--cache", str(cache),
            "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert set(first) >= {"plan", "previous_tokens_per_s", "tokens_per_s", "change",
                          "replan_time_s", "parallelizer_calls"}
    assert first["change"] == pytest.approx(
        first["tokens_per_s"] / first["previous_tokens_per_s"] - 1, abs=1e-6)
    tokens = 32 * 2048  # global batch x sequence length
    assert tokens / first["plan"]["objective"]["iteration_time_s"] == pytest.approx(
        first["tokens_per_s"], rel=1e-6)
    assert first["parallelizer_calls"] > 0 and list(cache.glob("v*/*/*.json"))
    assert main(argv + ["--stable-json"]) == 0  # the same replan again: all from the cache
    second = json.loads(capsys.readouterr().out)
    assert second["parallelizer_calls"] == 0 and second["replan_time_s"] == 0.0
    assert second["cache_hits"] == first["cache_hits"] + first["parallelizer_calls"]
    assert second["plan"]["stages"] == first["plan"]["stages"]
    for run in (first, second):  # the plan's own count and the re-planning's are the same calls
        assert run["calls"] == run["plan"]["solver"]["parallelizer_calls"] \
            == run["parallelizer_calls"] + run["cache_hits"]


def test_cli_replan_text(planned, tmp_path, capsys):
    job, plan = planned
    assert main(["replan", str(plan), "--job", str(job), "--fail", "h100-1",
                 "--cache", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "tokens/s (" in out and "re-planned in" in out and "parallelizer calls" in out


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["islands"][0].update(nodes=["h100-0"]), "is not an island of the job's cluster"),
    (lambda d: d["islands"].pop(), "the plan does not list"),
    (lambda d: d["objective"].update(iteration_time_s=d["objective"]["iteration_time_s"] * 1.1),
     "objective.iteration_time_s"),
    (lambda d: d["stages"][0].update(layers=[0, 99]), "stages[0].layers"),
    (lambda d: d["stages"][0].update(island="nowhere"), "unknown island 'nowhere'"),
])
def test_cli_rejects_a_plan_of_another_cluster(planned, tmp_path, capsys, edit, needle):
    job, plan = planned
    data = json.loads(plan.read_text())
    edit(data)
    plan.write_text(json.dumps(data))
    code = main(["replan", str(plan), "--job", str(job), "--cache", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1


def test_cli_unknown_node_and_prefix_clash(planned, tmp_path, capsys):
    job, plan = planned
    code = main(["replan", str(plan), "--job", str(job), "--fail", "b200-0",
                 "--cache", str(tmp_path / "c")])
    assert code == 2 and "--fail: unknown node 'b200-0'" in capsys.readouterr().err
    nodes = tmp_path / "nodes.toml"
    nodes.write_text('[[nodes]]\ngpu = "A100-SXM-80GB"\ncount = 1\nname = "a100"\n')
    code = main(["replan", str(plan), "--job", str(job), "--add", str(nodes),
                 "--cache", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and "already used" in err and f"{nodes}: nodes[0].name" in err


@pytest.mark.parametrize("path", sorted((INSTANCES / "nodes").glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_node_files_add_to_the_shipped_clusters(path):
    job = load_job(INSTANCES / "jobs" / "three-gen-llama3-70b.toml")
    added = load_added_nodes(path)
    bigger = apply_change(job.cluster, ClusterChange((), added, str(path)))
    assert bigger.total_gpus == job.cluster.total_gpus + sum(
        g.count * g.gpus_per_node for g in added.groups)
