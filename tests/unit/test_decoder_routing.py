"""The session model's choice between the main decoder and its busy twin (CPU twins)."""

from __future__ import annotations

from triton_sam.serving.decoder_routing import DecoderRouter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_one_user_on_one_image_always_gets_the_main_decoder_even_back_to_back() -> None:
    clock = Clock()
    router = DecoderRouter("dec", "dec_busy", window_s=0.1, clock=clock)
    for _ in range(5):
        assert router.start("a") == "dec"
        clock.t += 0.03
        router.finish("a")
        clock.t += 0.001  # the next click right after the answer
    assert router.in_flight == 0


def test_overlapping_clicks_go_to_the_busy_twin() -> None:
    clock = Clock()
    router = DecoderRouter("dec", "dec_busy", window_s=0.1, clock=clock)
    assert router.start("a") == "dec"
    assert router.start("a") == "dec_busy"  # the same user's speculative click overlaps
    assert router.start("b") == "dec_busy"
    assert router.in_flight == 3
    for image in ("a", "a", "b"):
        router.finish(image)
    assert router.in_flight == 0


def test_other_active_users_keep_clicks_on_the_busy_twin_until_the_window_passes() -> None:
    clock = Clock()
    router = DecoderRouter("dec", "dec_busy", window_s=0.1, clock=clock)
    router.start("b")
    clock.t += 0.04
    router.finish("b")
    clock.t += 0.01
    assert router.start("a") == "dec_busy"  # b was decoded 10 ms ago: a burst of users
    router.finish("a")
    clock.t += 0.2  # everyone else quiet for longer than the window
    assert router.start("a") == "dec"
    router.finish("a")


def test_without_a_busy_twin_every_click_gets_the_main_decoder() -> None:
    router = DecoderRouter("dec", "")
    assert [router.start(i) for i in "abc"] == ["dec"] * 3
