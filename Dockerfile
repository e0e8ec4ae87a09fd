# poolpilot control plane: operator, autoscaler, router (`poolpilot operator|autoscaler|router`).
# Build: docker build --build-arg REVISION=$(git rev-parse HEAD) -t ghcr.io/poolpilot/poolpilot:0.1.0 .
# Every room in pyproject's package-dir is copied except the tool rooms ([tool.poolpilot]
# dev-only: the emulator, perf harnesses, engine simulator, bench, sandbox, dashboard
# generator and test kit); setup.py skips those. The runtime dependencies come from
# requirements/runtime.lock (pip-compile --generate-hashes), installed with --require-hashes:
# every file pip fetches must match the lock. The base image is a build ARG so a digest can be
# pinned (--build-arg PYTHON_IMAGE=python:3.11-slim@sha256:...; docs/helm.md, "Images").
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY poolpilot poolpilot
COPY operator operator
COPY autoscaler autoscaler
COPY router router
COPY runtime_image runtime_image
COPY kubeclient kubeclient
# poolpilot's own wheel only; its dependencies come from the lock below.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="poolpilot" \
      org.opencontainers.image.description="poolpilot control plane: operator, autoscaler and router for vLLM inference pools" \
      org.opencontainers.image.source="https://github.com/poolpilot/poolpilot" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# Non-root with a numeric uid, so the restricted Pod Security Standard's runAsNonRoot holds.
# 65532 is every poolpilot container's uid (the chart's podSecurityContext, the operator's
# engine and router pods: operator/building_blocks.py RUN_AS_USER).
RUN groupadd --gid 65532 poolpilot \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin poolpilot
COPY requirements/runtime.lock /tmp/runtime.lock
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --require-hashes -r /tmp/runtime.lock \
 && pip install --no-cache-dir --no-deps /wheels/*.whl \
 && pip check \
 && rm -rf /wheels /tmp/runtime.lock
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["poolpilot"]
CMD ["--help"]
