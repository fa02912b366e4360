"""Three embedded Triton replicas behind a real nginx, one killed mid-run.

16 concurrent sessions (one sync client each, 8 images shared between them) click through
the proxy; after 40 % of the clicks the replica holding the most images is SIGKILLed. Over
HTTP and over gRPC:

- no click fails (the proxy re-sends in-flight requests to the next replica on the ring, the
  clients re-embed there through their miss path);
- the masks equal, click by click, those of the same scenario against one server: logits
  within LOGIT_TOLERANCE (1e-3; two servers agree to float32 rounding, not bit for bit), so
  binary masks equal except pixels whose logit is within that of 0; IoU scores within 1e-5;
- every replica answered requests and the images spread over several (spread), only the
  killed replica's images moved (consistent hashing), the survivors re-encoded them
  (re-embeds counted from their own counters), and one client on one connection reached more
  than one replica;
- every metric the Grafana dashboard and the HPA's adapter rules query is on the replicas'
  /metrics (GPU metrics aside), with the flags deploy/ passes.

The numbers are printed (``-s``); `triton-sam bench replicas` runs the long version.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(900)]

OPTIONS = dict(replicas=3, sessions=16, clicks=6, images=8, kill_after=0.4)
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Exported only where Triton sees a GPU.
GPU_METRICS = {"nv_gpu_utilization", "nv_gpu_memory_used_bytes"}


def deployed_queries() -> set[str]:
    """Metric names the Grafana dashboard and the autoscaler's adapter rules query."""
    text = (DEPLOY / "grafana" / "triton-sam.json").read_text()
    text += (DEPLOY / "prometheus" / "adapter-values.yaml").read_text()
    return set(re.findall(r"\b((?:nv|triton_sam)_[a-z_]+)\b", text)) - {
        "triton_sam_queue_us_per_request",  # the adapter's own names for the HPA
        "triton_sam_pending_requests",
    }


@pytest.fixture(scope="module")
def options():
    from triton_sam.bench.replicas import ReplicaBenchOptions

    return ReplicaBenchOptions(**OPTIONS)


@pytest.fixture(scope="module")
def single_server_runs(sam2_tiny_server, options):
    """The scenario against one server: the masks every replicated run must reproduce."""
    from triton_sam.bench.replicas import bench_images, run_sessions

    runs = run_sessions(sam2_tiny_server.http_address, "http", bench_images(options), options)
    assert not [e for run in runs for e in run.errors]
    return runs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_replicas_survive_a_killed_replica(
    protocol, sam2_tiny_repository, single_server_runs, options
):
    from triton_sam.bench.replicas import run_replicas
    from triton_sam.bench.replicas_report import LOGIT_TOLERANCE

    report = run_replicas(sam2_tiny_repository, protocol, options, reference=single_server_runs)
    print(json.dumps(report.summary(), indent=1))

    assert report.failed_clicks == 0, report.errors[:5]
    assert report.clicks == options.sessions * options.clicks
    # same masks (LOGIT_TOLERANCE: float32 rounding between servers, see replicas_report)
    assert report.mask_mismatches == 0
    assert report.max_logit_diff is not None and report.max_logit_diff <= LOGIT_TOLERANCE
    assert report.max_score_diff is not None and report.max_score_diff <= 1e-5
    # spread: every replica answered requests, and the images were hashed over several of them.
    # Which replica owns which image depends on the ring, which nginx builds from the replicas'
    # addresses (ports drawn at random each run): one replica owns none of the 8 images with
    # p = 3 * (2/3)^8 ~ 4 %, so that is allowed; all 8 on one replica (p = 3^-7 ~ 0.05 %) is not.
    # Requests without the routing header are spread round-robin, so each replica answers some.
    answered = set(report.requests_per_replica) | set(report.other_requests)
    assert sorted(answered) == [0, 1, 2]
    owners = set(report.owners_before.values())
    assert len(owners) >= 2
    assert owners <= {r for r, n in report.requests_per_replica.items() if n > 0}
    # failover: the victim held images; they (and only they) moved, and were embedded anew
    assert report.victim is not None
    victim_images = [k for k, owner in report.owners_before.items() if owner == report.victim]
    assert victim_images
    assert report.moved_from_survivors == []
    assert set(report.moved) == set(victim_images) & set(report.owners_after)
    assert report.moved
    assert report.reembeds >= len(report.moved)
    # one connection, many images: balanced per request, not pinned
    assert report.one_channel_replicas >= 2
    # what the dashboard and the HPA query exists (replicas run with deploy/'s metrics flags)
    assert deployed_queries() - GPU_METRICS <= report.metric_names
