"""The arithmetic of benchmarks/allreduce_model.py (docs/scaling.md's model)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("allreduce_model", REPO / "benchmarks" / "allreduce_model.py")
model = importlib.util.module_from_spec(spec)
sys.modules.setdefault(spec.name, model)  # dataclasses look their module up there
spec.loader.exec_module(model)


def test_ring_sends_2_n_minus_1_over_n_of_the_bytes():
    assert model.bytes_sent_per_worker(2, 100.0) == pytest.approx(100.0)
    assert model.bytes_sent_per_worker(4, 100.0) == pytest.approx(150.0)
    assert model.bytes_sent_per_worker(512, 100.0) == pytest.approx(2 * 511 / 512 * 100.0)


def test_allreduce_time_is_latency_plus_bandwidth_terms():
    link = model.Link("test", bandwidth=1e9, latency_s=1e-5)
    assert model.allreduce_seconds(1, 1e9, link) == 0.0
    assert model.allreduce_seconds(8, 1e9, link) == pytest.approx(14 * 1e-5 + 1.75)


def test_efficiency_bounds_and_overlap_needed():
    assert model.efficiency(1.0, 0.25, overlap=False) == pytest.approx(0.8)
    assert model.efficiency(1.0, 0.25, overlap=True) == pytest.approx(1.0)
    w = model.Workload("w", params=25_000_000, bytes_per_param=4, compute_s=1.0, source="test")
    link = model.Link("l", bandwidth=1e9, latency_s=0.0)  # all-reduce at N=2: 0.1 s
    assert model.overlap_needed(w, link, 2, target=1 / 1.05) == pytest.approx(0.5)


def test_table_has_a_row_per_workload_and_link():
    text = model.table()
    assert text.count("\n") == 1 + len(model.WORKLOADS) * len(model.LINKS)
    assert "N=512" in text
