"""``bench large``'s datasets and report, without a server: the synthetic images are written
chunk by chunk and once, an interrupted write is not taken for a dataset, and the report's
tables carry the run's numbers."""

from __future__ import annotations

import numpy as np
import zarr

from triton_sam.bench import large as bench


def test_datasets_are_written_once_and_a_partial_write_is_redone(tmp_path):
    (tmp_path / ".300.zarr.partial").mkdir()  # a run killed while writing
    folder = bench.datasets(tmp_path, (300, 2100))
    big = zarr.open_array(str(folder / "2100.zarr"), mode="r")
    assert big.shape == (2100, 2100) and big.dtype == np.uint8 and big.chunks == (1024, 1024)
    block = big[1000:1100, 1000:1100]
    assert block.min() >= 40 and block.max() <= 255
    stamp = (folder / "300.zarr").stat().st_mtime_ns
    bench.datasets(tmp_path, (300,))
    assert (folder / "300.zarr").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert not (tmp_path / ".300.zarr.partial").exists()


def test_the_report_tables_carry_the_runs_numbers(tmp_path):
    report = bench.LargeReport(
        {"small": 1024, "large": 20000, "clicks": 3, "precompute_tiles": 2},
        open_first=[
            {
                "side": 1024,
                "open_ms": 5.0,
                "first_mask_ms": 900.0,
                "encoder_runs": 1,
                "request_bytes": 60,
                "mask_bytes": 120,
            },
            {
                "side": 20000,
                "open_ms": 30.0,
                "first_mask_ms": 950.0,
                "encoder_runs": 1,
                "request_bytes": 62,
                "mask_bytes": 118,
                "server_peak_bytes": 2000 * 2**20,
            },
        ],  # fmt: skip
        clicks={
            "small": {"p50": 10.0, "p95": 12.0},
            "large": {"p50": 11.0, "p95": 14.0},
            "via_large_model": {"p50": 13.0, "p95": 15.0},
            "ratio_p50": 1.1,
            "ratio_p95": 1.17,
            "via_large_model_ratio_p50": 1.3,
            "via_large_model_ratio_p95": 1.25,
        },
        precompute={"tiles": 2, "tiles_per_s": 1.8, "encoder_images_per_s": 2.0, "ratio": 0.9},
        memory={
            "server_peak_bytes": 3 * 2**30,
            "client_peak_bytes": 900 * 2**20,
            "client_growth_bytes": 200 * 2**20,
        },
    )
    paths = bench.write_report(report, tmp_path)
    text = paths["md"].read_text()
    assert "| 20,000² | 30.0 | 950.0 | 1 | 62 | 118 | 2000 |" in text
    assert "| 1,024² | 5.0 | 900.0 | 1 | 60 | 120 | - |" in text
    assert "| ratio | 1.1 | 1.17 |" in text
    assert "through the large model (page, curl) | 13.0 | 15.0 |" in text
    assert "| its ratio | 1.3 | 1.25 |" in text
    assert "| precompute (2 tiles) | 1.8 | 0.9 |" in text
    assert "| server | 3072 |" in text and "| client (growth during the run) | 200 |" in text
    assert paths["png"].stat().st_size > 1000
