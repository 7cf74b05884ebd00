"""Each pruning rule on numbers worked out by hand (the comments show the arithmetic)."""

from __future__ import annotations

import pytest

from solver.planner.pruning import (LinkModel, Rule, balance_window, bound_window, dedupe_slices,
                                    interface_bans, interface_bans_safe, layer_work_flops,
                                    memory_cap, peak_flops, precision_speedup,
                                    stage_time_lb)
from solver.spec.domain import Island, Precision
from solver.spec.loaders import INSTANCES, load_catalog, load_model


@pytest.fixture(scope="module")
def islands():
    cat = load_catalog()
    return (Island.homogeneous("h", cat["H100-SXM-80GB"], 8),      # 7,912 TFLOP/s
            Island.homogeneous("a", cat["A100-SXM-80GB"], 16))     # 4,992 TFLOP/s


def test_rule_labels_and_sets():
    assert Rule.paper().label == "1,2,3,4"
    assert Rule.safe().label == "1,2s,3,4s"
    assert Rule.NONE.label == "none"
    assert Rule.DEDUPE in Rule.safe() and Rule.BALANCE not in Rule.safe()


def test_rule_1_dedupe_keeps_one_slice_per_position():
    # 6 layers, length 2: starts 0..4; positions (first, last): (T,F) at 0, (F,F) at 1, (F,T) at 4.
    assert dedupe_slices(6, 2, True) == [(0, 2), (1, 3), (4, 6)]
    assert dedupe_slices(6, 2, False) == [(0, 2), (1, 3), (2, 4), (3, 5), (4, 6)]
    assert dedupe_slices(3, 3, True) == [(0, 3)]  # the only slice is first and last


def test_rule_2_balance_window_by_hand(islands):
    h, a = islands
    # Share of 20 layers: 20 * 7912 / 12904 = 12.26; beta 1.25: [ceil(9.81), floor(15.33)].
    assert balance_window(islands, h, 20, 1.25) == (10, 15)
    # A100: 20 * 4992 / 12904 = 7.74; [ceil(6.19), floor(9.67)] = [7, 9].
    assert balance_window(islands, a, 20, 1.25) == (7, 9)
    # The window is clipped to [1, L].
    assert balance_window(islands, h, 20, 10.0) == (2, 20)
    assert balance_window((h,), h, 5, 2.0) == (3, 5)   # share 5: [ceil(2.5), min(5, 10)]


def test_work_and_time_lower_bound(islands):
    h, _ = islands
    model = load_model(INSTANCES / "models" / "llama2-7b.toml")
    per_layer = model.active_params_per_layer - model.norm_params
    assert layer_work_flops(model, 2, 4096) == 6.0 * per_layer * 2 * 4096
    # 3 layers of 7.912e15 FLOP on 7,912 TFLOP/s: 3 s.
    assert stage_time_lb(h, 3, 7.912e15) == pytest.approx(3.0)


def test_time_lower_bound_at_fp8(islands):
    # An FP8 job: the H100's GEMMs may run at 1,979 TFLOP/s (8 GPUs: 15,832); the A100 has no
    # FP8 and keeps its 16-bit 312 (16 GPUs: 4,992).
    h, a = islands
    assert peak_flops(h, Precision.FP8) == pytest.approx(8 * 1979e12)
    assert peak_flops(a, Precision.FP8) == pytest.approx(16 * 312e12)
    assert stage_time_lb(h, 3, 7.912e15, Precision.FP8) == pytest.approx(3 * 7.912 / 15.832)
    assert precision_speedup(h, Precision.FP8) == pytest.approx(1979 / 989)
    assert precision_speedup(a, Precision.FP8) == 1.0 == precision_speedup(h, Precision.BF16)
    # The safe window of rule 2 at FP8: 10 layers of 1e15 FLOP, n = 4. The H100 group alone
    # needs 4·ℓ/15.832 <= upper, the A100 the rest, 4·(10 − ℓ)/4.992 <= upper. Upper 1.8 s:
    # ℓ <= 7.1 and ℓ >= 7.8; 2.0 s: ℓ <= 7.9 and ℓ >= 7.5 (no integer); 2.2 s: ℓ <= 8.7, ℓ >= 7.3.
    assert bound_window((h, a), h, 10, 1e15, 4, 1.8, Precision.FP8) == (11, 0)
    assert bound_window((h, a), h, 10, 1e15, 4, 2.0, Precision.FP8) == (11, 0)
    assert bound_window((h, a), h, 10, 1e15, 4, 2.2, Precision.FP8) == (8, 8)


def test_rule_3_memory_cap_by_hand(islands):
    h, _ = islands
    model = load_model(INSTANCES / "models" / "llama2-7b.toml")
    # Budget: 0.9 * 80 GB * 8 GPUs / 18 B = 32e9 params; minus the embedding when first.
    budget = 0.9 * 80e9 * 8 / 18
    assert memory_cap(model, h, 0.1, False, False) == min(model.layers,
                                                          int(budget // model.params_per_layer))
    tight = Island.homogeneous("t", load_catalog()["V100-SXM2-32GB"], 1)
    # 0.9 * 32 GB * 1 / 18 B = 1.6e9 params: 1.6e9 - 131M embedding = 1.47e9 / 202M = 7 layers.
    room = 0.9 * 32e9 / 18 - model.embedding_params
    assert memory_cap(model, tight, 0.1, True, False) == int(room // model.params_per_layer) == 7
    assert memory_cap(model, tight, 0.1, True, True) == 6
    assert memory_cap(model, tight, 0.99, True, True) == 0


def test_link_model_by_hand(islands):
    h, a = islands
    # 4e9 bytes over 100 Gb/s per GPU = 0.32 s * GPU; the boundary of min(8, 16) GPUs: 0.04 s.
    lm = LinkModel(4e9, 100.0)
    assert lm.rate(h, a) == pytest.approx(0.32)
    assert lm.time(h, a) == pytest.approx(0.04)
    # Inside one island the NIC carries it (H100 catalog NIC).
    assert lm.rate(h, h) == pytest.approx(4e9 / (h.nic_gbits / 8 * 1e9))
    # Without a cluster figure: the smaller NIC of the pair.
    assert LinkModel(4e9, None).rate(h, a) == pytest.approx(
        4e9 / (min(h.nic_gbits, a.nic_gbits) / 8 * 1e9))


def test_rule_4_interface_bans_by_hand():
    links = {("a", "b"): 0.3, ("b", "a"): 0.5, ("a", "c"): 0.51}
    # Heuristic: ban c > 0.5 * 1.0.
    assert interface_bans(links, 1.0) == {("a", "c")}
    assert interface_bans(links, 1.0, threshold=0.4) == {("b", "a"), ("a", "c")}
    # Safe: ban n * c > upper: 4 * 0.5 = 2.0 is not above 2.0; 4 * 0.51 is.
    assert interface_bans_safe(links, 4, 2.0) == {("a", "c")}
    assert interface_bans_safe(links, 4, 1.2) == {("b", "a"), ("a", "c")}


def test_rule_2s_on_one_island_keeps_only_the_whole_model(islands):
    import math
    h, _ = islands
    # One island: the rest of the model has nowhere else to go, so only l = L can stay, and
    # only while n * L * w / C fits the incumbent: 4 * 10 * 1e15 / 7.912e15 = 5.056 s.
    assert bound_window((h,), h, 10, 1e15, 4, 6.0) == (10, 10)
    assert bound_window((h,), h, 10, 1e15, 4, 0.9) == (11, 0)
    # The bound equal to the incumbent is kept (ties stay).
    exact = 4 * stage_time_lb(h, 10, 1e15)
    assert bound_window((h,), h, 10, 1e15, 4, exact) == (10, 10)
    assert bound_window((h,), h, 10, 1e15, 4, math.nextafter(exact * (1 - 2e-12), 0)) == (11, 0)


def test_rule_4s_keeps_a_link_whose_bound_ties_the_incumbent():
    # 4 * c == upper * (1 + 1e-12) exactly (division by 4 is exact in binary): not banned.
    c = (1.0 * (1 + 1e-12)) / 4
    assert 4 * c == 1.0 * (1 + 1e-12)
    assert interface_bans_safe({("a", "b"): c}, 4, 1.0) == frozenset()


def test_rule_2s_one_island_rest_costs_nothing(islands):
    h, _ = islands
    # 10 layers of 1e14 FLOP: n L w / C = 4e15 / 7.912e15 = 0.506 s; the rest (none) costs 0,
    # so an incumbent of 0.8 s keeps l = 10.
    assert bound_window((h,), h, 10, 1e14, 4, 0.8) == (10, 10)
