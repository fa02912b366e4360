"""The Paintera measurements' bookkeeping, with sam-link's replay and Triton's stats faked:
which models each request names, with which shape, and what is counted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from triton_sam.bench import paintera
from triton_sam.repository.entry import PIXELS_SUFFIX


class FakeReplay:
    """Answers every request at once; records (model, input, shape) of each."""

    sent: list[tuple[str, str, list[int]]] = []

    def __init__(self, address: str) -> None:
        self.address = address

    def send(self, model: str, name: str, shape: list[int], raw: bytes) -> tuple[str, int]:
        FakeReplay.sent.append((model, name, shape))
        return str(len(FakeReplay.sent)), 0

    def wait(self, request_id: str) -> SimpleNamespace:
        return SimpleNamespace(error_message="")

    def infer(self, model: str, name: str, shape: list[int], raw: bytes) -> SimpleNamespace:
        return self.wait(self.send(model, name, shape, raw)[0])

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch):
    FakeReplay.sent = []
    counts = iter([(10, 4, 1.0), (15, 6, 3.5)])  # before, after
    monkeypatch.setattr(paintera, "SamLinkReplay", FakeReplay)
    monkeypatch.setattr(paintera, "_counts", lambda url, model: next(counts))
    monkeypatch.setattr(paintera, "_STATS_SETTLE_S", 0.0)
    return FakeReplay


def test_bundle_names_the_normalising_graph_as_the_repository_writes_it():
    assert paintera.BUNDLE["sam2"].normalizer == "sam2.1_large_encoder" + PIXELS_SUFFIX
    assert paintera.BUNDLE["sam3"].normalizer is None
    assert paintera.BUNDLE["sam3"].shape == [1, 3, 1008, 1008]
    assert all(pair.family == family for family, pair in paintera.BUNDLE.items())


def test_entry_overhead_interleaves_entry_and_encoder(fake):
    pair = paintera.EntryPair("sam1", "entry", "encoder", "image", 8, (0.0, 1.0), True)
    out = paintera.entry_overhead("grpc:1", "http://h:1", pair, rounds=2)
    assert [m for m, _, _ in fake.sent] == ["entry", "encoder"] * 3  # warm-up + 2 rounds
    assert {(n, tuple(s)) for _, n, s in fake.sent} == {("image", (1, 3, 8, 8))}
    assert set(out) == {"entry_p50_ms", "encoder_p50_ms", "overhead_ms", "normalizer_compute_ms"}
    assert out["normalizer_compute_ms"] == pytest.approx(2.5 / 5)


def test_stale_burst_counts_what_the_encoder_ran(fake):
    pair = paintera.EntryPair("sam3", "entry", "encoder", "pixel_values", 8, (-1.0, 1.0), False)
    out = paintera.stale_burst("grpc:1", "http://h:1", pair, requests=3, spacing_s=0.0)
    assert [m for m, _, _ in fake.sent] == ["entry"] * 4  # warm-up + the burst
    assert (out["requests"], out["encoder_inferences"], out["encoder_executions"]) == (3, 5, 2)
    assert out["errors"] == 0 and out["failed_positions"] == []
