"""A model-card choice charges the data-parallel step as the estimate times it (issue 31
follow-up): per layer the exposed step collectives of ``provenance``, summed over a device's
layers; the floor every bound adds is their average over the devices; planned with the
profile's own constant."""

from __future__ import annotations

import numpy as np
import pytest

import sapptk
from sapptk.choosing.records import device_sync_ms, sync_floor
from sapptk.choosing.setups import Candidate, Setup
from sapptk.models import Parallel, estimate_profile, hardware
from sapptk.models.ops import layer_param_split
from tests.support import small_profile


def _candidate(sync: tuple[float, ...]) -> Candidate:
    profile = small_profile(np.random.default_rng(3), groups=2, layers=(4, 6))
    config = sapptk.PipelineConfig(2, 4)
    return Candidate(setup=Setup(config=config, dp=4), profile=profile, layer_sync_ms=sync)


def _counts(stage0: tuple[int, int], stage1: tuple[int, int]) -> np.ndarray:
    counts = np.zeros((2, len(sapptk.profile.MODES), 2), dtype=np.int64)
    counts[:, 0, 0], counts[:, 0, 1] = stage0, stage1
    return counts


def test_device_sync_sums_its_layers_and_the_floor_is_their_average() -> None:
    c = _candidate((0.5, 1.0))
    # stage 0: 4 x 0.5 + 2 x 1.0 = 4.0; stage 1: 4 x 1.0 = 4.0
    assert device_sync_ms(c, _counts((4, 2), (0, 4)), None, None) == pytest.approx(4.0)
    # stage 0: 4 x 0.5 = 2.0; stage 1: 6 x 1.0 = 6.0 -> the slower device
    assert device_sync_ms(c, _counts((4, 0), (0, 6)), None, None) == pytest.approx(6.0)
    # (4 x 0.5 + 6 x 1.0) / 2 devices: no plan charges less
    assert sync_floor(c, 123.0) == pytest.approx(4.0)
    # the bandwidth is the bare profile's model only
    assert device_sync_ms(c, _counts((4, 2), (0, 4)), None, 1e-9) == pytest.approx(4.0)


def test_dp_inside_a_node_is_nvlink_across_nodes_the_nic() -> None:
    # llama2-7b, tp 2: dp 4 spans ranks 0..7 (one node of 8); dp 8 spans 16 ranks (two nodes)
    hw = hardware("h100")
    for dp, link, gbps in ((4, "intra", hw.intra_node_gbps * hw.intra_bus_efficiency),
                           (8, "inter", hw.inter_node_gbps * hw.inter_bus_efficiency)):
        par = Parallel(tp=2, dp=dp)
        frame = sapptk.models.operators("llama2-7b", par, hw)
        step = frame[(frame["phase"] == "step") & (frame["group"] == "layers")].set_index("op")
        dense, _ = layer_param_split(sapptk.models.card("llama2-7b"), par, False)
        rs = step.loc["dp_grad_reduce_scatter"]
        assert rs["placement"] == link
        # fp32 gradients, reduce-scatter bus factor (n-1)/n, at the link's bus bandwidth
        assert rs["time_ms"] == pytest.approx(hw.comm_latency_us / 1e3 + 4 * dense * (dp - 1) / dp / (gbps * 1e6))
        profile = estimate_profile("llama2-7b", par, hw)
        exposed = profile.provenance["dp_step_exposed_ms_per_layer"]["layers"]
        assert exposed == pytest.approx(step["exposed_ms"].sum(), abs=1e-6)


def test_a_card_choice_charges_the_estimates_step_and_constant() -> None:
    hw = dict(vars(hardware("h100")))
    hw.update(name="h100x2", gpus_per_node=2)  # dp 2 x tp 2 spans two nodes: the NIC
    choice = sapptk.choose(sapptk.models.card("llama2-7b"), hardware=hw, devices=8, global_batch=8,
                           memory_budget=None, schedules=["1f1b"], tp=[2], stages=[2], seq_length=2048,
                           setup_time_limit=3, deterministic=True)
    row = choice.frame.iloc[0]
    par = Parallel(tp=2, dp=2, seq_length=2048)
    profile = estimate_profile("llama2-7b", par, hardware(hw))
    per_layer = profile.provenance["dp_step_exposed_ms_per_layer"]["layers"]
    assert per_layer > 0
    layers = np.asarray(choice.best.counts).sum(axis=(0, 1))  # body layers per stage
    assert row["dp_sync_ms"] == pytest.approx(per_layer * layers.max(), rel=1e-9)
    assert row["step_time_ms"] == pytest.approx(row["pipeline_ms"] + row["dp_sync_ms"])
    assert choice.best.config.constant_memory == pytest.approx(profile.provenance["constant_mb"])
    balanced = choice.frame[choice.frame["status"] == "balanced"]
    assert (balanced["bound_ms"] <= balanced["step_time_ms"] + 1e-9).all()  # the floor stays a lower bound
