# The GPU server: NVIDIA's Triton image plus what triton-sam's python-backend models import.
# Built and run by `docker compose up -d` (docker-compose.yml); the model repository is mounted
# read-only at /models, never baked in.
#
# Pinned: the base image (r24.10 = Triton 2.51, the version the embedded server and the tests
# run) and every package the python-backend stubs import, with their hashes, from
# requirements/lock-container.txt (tests/unit/test_compose.py checks both).
ARG TRITON_BASE=nvcr.io/nvidia/tritonserver:24.10-py3
FROM ${TRITON_BASE}

# The stubs run the image's system Python, 3.10 (Ubuntu 22.04), not the project venv's 3.11:
# lock-container.txt is compiled for it (`make lock`; requirements/container.in says what
# each package is for) and holds every dependency, so pip resolves nothing here.
# Pillow: the <family>_session model decodes image files itself (serving/intake.py).
# tokenizers: the sam3_concept model tokenises its phrases. numpy<2: the python backend stub.
# tensorstore (zarr, N5), tifffile with imagecodecs and zarr (TIFF): the <family>_large model
# reads datasets under the data roots (serving/datasets/).
COPY requirements/lock-container.txt /opt/triton-sam/lock-container.txt
RUN python3 -m pip install --no-cache-dir --require-hashes --no-deps \
        -r /opt/triton-sam/lock-container.txt

# Liveness (compose healthcheck / Kubernetes probe): ready AND every session model's stub
# alive; Triton 2.51 keeps a model READY after its stub died (triton_sam/server/health.py).
COPY scripts/health_check.sh /opt/triton-sam/health_check.sh
RUN chmod 0755 /opt/triton-sam/health_check.sh
# Refuses to start a tritonserver whose control APIs are open or keyed by a guessable secret
# (the published "change-me", a short key), then runs NVIDIA's entrypoint.
COPY scripts/triton_entrypoint.sh /opt/triton-sam/entrypoint.sh
RUN chmod 0755 /opt/triton-sam/entrypoint.sh
ENTRYPOINT ["/opt/triton-sam/entrypoint.sh"]
