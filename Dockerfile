# The image that docker-compose.yml and ops/k8s/ run: the three console scripts
# (pipeline-worker, pipeline-scheduler, pipeline, with the dashboard's `web` extra) on a slim
# Python, as a non-root user.
#
#   docker build -t kafka-pipeline .
#   docker run --rm kafka-pipeline pipeline --help
#
# Your own application: build FROM this image and COPY your package into /app (the working
# directory, which --app MODULE imports from), or install it into /opt/pipeline.

ARG PYTHON_IMAGE=python:3.11-slim

# Stage 1: build the wheel and install it with its dependencies into a virtualenv.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas/ schemas/
COPY libs/ libs/
COPY services/ services/
RUN python -m venv /opt/pipeline \
    && /opt/pipeline/bin/pip install '.[web]'

# Stage 2: the runtime, without the sources or the build tools.
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 pipeline \
    && useradd --system --uid 10001 --gid pipeline --no-create-home \
       --home-dir /app --shell /usr/sbin/nologin pipeline
COPY --from=build /opt/pipeline /opt/pipeline
WORKDIR /app
# The demo application the compose file runs (--app examples.app).
COPY examples/__init__.py examples/app.py examples/
ENV PATH=/opt/pipeline/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
# The metrics ports the compose file and the manifests use (PIPELINE_*__METRICS_PORT, and
# `pipeline exporter --metrics-port 8002`), and the dashboard's (pipeline web --host 0.0.0.0,
# with PIPELINE_WEB__TOKEN set).
EXPOSE 8000 8001 8002 8180
# No ENTRYPOINT: the command names the console script, so the process gets SIGTERM directly.
#   pipeline-worker --app examples.app | pipeline-scheduler --app examples.app | pipeline ...
CMD ["pipeline", "--help"]
