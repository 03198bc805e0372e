# syntax=docker/dockerfile:1
# The SDG manager image: `make docker-build IMG=...`; without a registry for the base image,
# `make image` (hack/image.py: podman, on a Debian base made by mmdebstrap).
#
# builder: build the two wheels (sdgruntime, its own distribution in sdgruntime/, and
#          shared-device-group, which depends on it) and the wheels of all their
#          dependencies, from only the files the packages need (.dockerignore allows
#          nothing else into the context).
# final:   a slim Python with those wheels installed into a venv, no compiler, no pip cache,
#          running as a numeric non-root UID so `runAsNonRoot` can be verified by the kubelet.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sdgruntime/ sdgruntime/
COPY api/ api/
COPY controllers/ controllers/
COPY webhooks/ webhooks/
COPY cli/ cli/
# With the otlp extra (the OTLP/HTTP span exporter): OTEL_TRACES_EXPORTER=otlp works in the
# image, configured by OTEL_* env alone.
RUN pip wheel --wheel-dir /wheels ./sdgruntime ".[otlp]" \
 && ls /wheels/sdgruntime-*.whl /wheels/shared_device_group-*.whl

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="sdg-manager" \
      org.opencontainers.image.description="Shared Device Group manager: several pods share one declared set of GPUs on one node" \
      org.opencontainers.image.licenses="Apache-2.0"
# MALLOC_MMAP_THRESHOLD_: a fixed glibc mmap threshold (128 KiB, its default start). Left
# dynamic, glibc raises it after the first big free, and then every TLS connection's 256 KiB
# buffer lands in the heap and leaves a hole when the connection closes: the manager's RSS
# crept ~0.4 MiB/min under churn with nothing held (hack/bench/RESULTS.md, session 18);
# fixed, big buffers are mmapped and returned when freed. The manager sets the same itself
# where this is unset (controllers.__main__.tune_malloc); here it covers the whole image.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_MMAP_THRESHOLD_=131072 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    HOME=/tmp \
    PATH=/opt/sdg/bin:$PATH
# The builder stage's image ID (hack/image.py passes it): podman 4.3's buildah keys this step's
# cache on its text and args, not on the stage it mounts, and would reuse the venv of older
# wheels after a source change. docker build keys the step on the mount and leaves it empty.
ARG BUILDER_ID=
# Only wheels from the builder, nothing from an index: the image holds exactly what was built
# (sdgruntime, a dependency of shared-device-group, comes from /wheels like the others).
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv /opt/sdg \
 && /opt/sdg/bin/pip install --no-index --find-links=/wheels \
      "$(ls /wheels/shared_device_group-*.whl)[otlp]" \
 && /opt/sdg/bin/pip uninstall --yes pip \
 && /opt/sdg/bin/sdg-manager --help > /dev/null \
 && /opt/sdg/bin/python -c "import opentelemetry.exporter.otlp.proto.http.trace_exporter"
# 65532 is the conventional "nonroot" UID of distroless images; no passwd entry is needed.
USER 65532:65532
WORKDIR /
ENTRYPOINT ["sdg-manager"]
