"""The session model's choice between the main decoder and its busy twin (CPU twins)."""

from __future__ import annotations

from triton_sam.serving.decoder_routing import DecoderRouter


def test_clicks_one_after_another_always_get_the_main_decoder() -> None:
    router = DecoderRouter("dec", "dec_busy")
    for image in "aab":
        assert router.start(image) == "dec"
        router.finish(image)
    assert router.in_flight == 0


def test_one_users_overlapping_clicks_stay_on_the_main_decoder() -> None:
    # A speculative client's clicks on one image: the newest matters, it gets all threads.
    router = DecoderRouter("dec", "dec_busy")
    assert [router.start("a") for _ in range(3)] == ["dec"] * 3
    assert router.in_flight == 3


def test_clicks_while_another_images_click_is_decoded_go_to_the_busy_twin() -> None:
    router = DecoderRouter("dec", "dec_busy")
    assert router.start("a") == "dec"
    assert router.start("b") == "dec_busy"
    assert router.start("a") == "dec_busy"  # b is in flight now
    router.finish("b")
    assert router.start("a") == "dec"  # only a's own clicks in flight
    for _ in range(3):
        router.finish("a")
    assert router.in_flight == 0 and router.start("c") == "dec"


def test_without_a_busy_twin_every_click_gets_the_main_decoder() -> None:
    router = DecoderRouter("dec", "")
    assert [router.start(i) for i in "abc"] == ["dec"] * 3
