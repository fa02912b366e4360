"""The session model's choice between the main decoder and its busy twin (CPU twins)."""

from __future__ import annotations

from triton_sam.serving.decoder_routing import DecoderRouter


def test_clicks_one_after_another_always_get_the_main_decoder() -> None:
    router = DecoderRouter("dec", "dec_busy")
    for _ in range(5):
        assert router.start() == "dec"
        router.finish()
    assert router.in_flight == 0


def test_overlapping_clicks_go_to_the_busy_twin_until_none_is_in_flight() -> None:
    router = DecoderRouter("dec", "dec_busy")
    assert [router.start() for _ in range(3)] == ["dec", "dec_busy", "dec_busy"]
    router.finish()
    assert router.start() == "dec_busy"  # two still in flight
    for _ in range(3):
        router.finish()
    assert router.in_flight == 0 and router.start() == "dec"


def test_without_a_busy_twin_every_click_gets_the_main_decoder() -> None:
    router = DecoderRouter("dec", "")
    assert [router.start() for _ in range(3)] == ["dec"] * 3
