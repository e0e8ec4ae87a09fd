# poolpilot control plane: operator, autoscaler, router (`poolpilot operator|autoscaler|router`).
# Build: docker build -t ghcr.io/poolpilot/poolpilot:0.1.0 .
# Every room in pyproject's package-dir is copied except the tool rooms ([tool.poolpilot]
# dev-only: the emulator, perf harnesses, engine simulator, bench, sandbox, dashboard
# generator and test kit); setup.py skips those, and only the runtime dependencies are installed.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY poolpilot poolpilot
COPY operator operator
COPY autoscaler autoscaler
COPY router router
COPY runtime_image runtime_image
COPY kubeclient kubeclient
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# Non-root with a numeric uid, so the restricted Pod Security Standard's runAsNonRoot holds.
RUN groupadd --gid 65532 poolpilot \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin poolpilot
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["poolpilot"]
CMD ["--help"]
