"""The backend's memory of recently fetched task images: per tenant, bounded in bytes and
age, and never a way around the fetcher's URL checks."""

from __future__ import annotations

import pytest

from triton_sam.errors import ImageUrlRefusedError
from triton_sam.label_studio.recent import RecentImages


class CountingFetcher:
    """The two calls RecentImages makes of a Fetcher; files are ``size`` bytes of the URL."""

    def __init__(self, size: int = 10) -> None:
        self.size, self.fetched = size, []

    def resolve(self, url: object, field: str) -> str:
        if not str(url).startswith("/data/"):
            raise ImageUrlRefusedError(field, f"{url} is outside Label Studio's origin")
        return "http://ls" + str(url)

    def fetch_image(self, url: object, field: str) -> tuple[bytes, tuple[int, int]]:
        self.fetched.append(url)
        return (str(url).encode() * self.size)[: self.size], (4, 3)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_tenants_second_click_reuses_the_file_another_tenant_fetches_its_own():
    fetcher = CountingFetcher()
    images = RecentImages(fetcher)
    first = images.fetch_image("/data/a.png", "f", tenant="lab-a")
    assert images.fetch_image("/data/a.png", "f", tenant="lab-a") == first
    assert fetcher.fetched == ["/data/a.png"]
    assert images.fetch_image("/data/a.png", "f", tenant="lab-b") == first
    assert fetcher.fetched == ["/data/a.png", "/data/a.png"]


def test_an_entry_older_than_the_bound_is_fetched_again():
    fetcher, clock = CountingFetcher(), Clock()
    images = RecentImages(fetcher, max_age_s=60.0, clock=clock)
    images.fetch_image("/data/a.png", "f", tenant="t")
    clock.now = 59.0
    images.fetch_image("/data/a.png", "f", tenant="t")
    assert len(fetcher.fetched) == 1
    clock.now = 60.0
    images.fetch_image("/data/a.png", "f", tenant="t")
    assert len(fetcher.fetched) == 2


def test_bytes_are_bounded_least_recently_used_out_and_a_file_over_the_bound_never_kept():
    fetcher = CountingFetcher(size=10)
    images = RecentImages(fetcher, max_bytes=25)
    for name in ("a", "b"):
        images.fetch_image(f"/data/{name}.png", "f", tenant="t")
    images.fetch_image("/data/a.png", "f", tenant="t")  # a is now the most recent
    images.fetch_image("/data/c.png", "f", tenant="t")  # 30 bytes: b goes
    assert images.kept_bytes == 20
    images.fetch_image("/data/a.png", "f", tenant="t")
    images.fetch_image("/data/b.png", "f", tenant="t")
    assert fetcher.fetched == [f"/data/{n}.png" for n in "abcb"]

    big = RecentImages(CountingFetcher(size=26), max_bytes=25)
    big.fetch_image("/data/a.png", "f", tenant="t")
    assert big.kept_bytes == 0


def test_a_refused_url_is_refused_even_after_an_allowed_fetch():
    images = RecentImages(CountingFetcher())
    images.fetch_image("/data/a.png", "f", tenant="t")
    with pytest.raises(ImageUrlRefusedError, match="outside"):
        images.fetch_image("file:///data/a.png", "tasks[0].data.image", tenant="t")
