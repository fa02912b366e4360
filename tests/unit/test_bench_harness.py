"""bench.harness, bench.stats and bench.memory without a server: the one way a benchmark
builds a repository and what every report computes of its samples."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from triton_sam.bench import harness, memory, stats


@pytest.fixture
def builds(monkeypatch, tmp_path):
    """build_repository and embedded_repository recorded instead of run."""
    from triton_sam.repository import writer
    from triton_sam.setup import pipeline

    calls: list[dict] = []

    def build(spec, repository, **options):
        calls.append({"spec": spec, "repository": repository, **options})
        (repository / "sam2_everything").mkdir(parents=True)

    monkeypatch.setattr(pipeline, "build_repository", build)
    monkeypatch.setattr(writer, "embedded_repository", lambda repo: repo.parent / "twin")
    return calls


def test_setup_repository_builds_random_weights_without_a_checkpoint(builds, tmp_path):
    repo = tmp_path / "model_repository"
    served = harness.setup_repository("spec", repo, everything=True)
    assert served == tmp_path / "twin"  # the CPU twin is what the embedded server serves
    (call,) = builds
    assert call["checkpoint"] is None and call["random_init"] is True
    assert call["everything"] is True and call["repository"] == repo


def test_setup_repository_reuses_a_finished_build(builds, tmp_path):
    repo = tmp_path / "model_repository"
    checkpoint = tmp_path / "weights.pt"
    for _ in range(2):
        harness.setup_repository("spec", repo, checkpoint=checkpoint, reuse_model="sam2_everything")
    (call,) = builds  # the second call found sam2_everything and did not build again
    assert call["checkpoint"] == checkpoint and call["random_init"] is False


def test_setup_repository_without_twin_returns_the_repository(builds, tmp_path):
    repo = tmp_path / "model_repository"
    assert harness.setup_repository("spec", repo, checkpoint=tmp_path, twin=False) == repo


def test_protocol_urls_pick_the_server_endpoints():
    class Server:
        http_url, grpc_url = "http://h:1", "h:2"

    assert harness.protocol_urls(Server()) == {"http": "http://h:1", "grpc": "h:2"}
    assert harness.protocol_urls(Server(), ["grpc"]) == {"grpc": "h:2"}


def test_percentiles_are_p50_p95_p99_max_and_nan_when_empty():
    figures = stats.percentiles([float(v) for v in range(1, 101)])
    assert figures == pytest.approx({"p50": 50.5, "p95": 95.05, "p99": 99.01, "max": 100.0})
    assert stats.percentiles([1.234, 2.345], digits=1)["max"] == 2.3
    assert all(math.isnan(v) for v in stats.percentiles([]).values())


def test_ratio_is_nan_when_a_side_is_missing():
    assert stats.ratio(3.0, 2.0) == 1.5
    assert math.isnan(stats.ratio(3.0, 0.0)) and math.isnan(stats.ratio(math.nan, 2.0))


def test_memory_of_a_process_tree_counts_its_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alone = memory.process_tree_rss(child.pid)
        with_child = memory.process_tree_rss(os.getpid())
        assert alone and with_child and with_child > alone
        # a client whose embedded server is its child is measured without it
        own = memory.process_tree_rss(os.getpid(), children=False)
        assert own and with_child - own >= alone * 0.9  # PSS: the child's pages, shared or not
    finally:
        child.kill()
        child.wait()
    assert memory.process_tree_rss(child.pid) is None  # gone


def test_samplers_record_at_least_one_sample_per_block():
    with memory.MemorySampler(os.getpid(), 60.0) as sampler:
        sample = sampler.sample()
    assert sampler.samples == [sample] and sample.client > 0 and sample.server
    with memory.PeakMemory(os.getpid(), 60.0) as peak:
        pass
    assert peak.bytes and peak.bytes > 0
    with memory.PeakMemory(None, 60.0) as nothing:
        pass
    assert nothing.bytes is None
    with memory.TreePeaks(60.0) as tree:
        pass
    assert tree.peaks["tree"] >= tree.peaks["servers"] >= 0 and tree.peaks["own"] > 0
