# syntax=docker/dockerfile:1
# The mqtt-bridge node image: `docker build -t mqtt-bridge .` (docker-compose.yml builds it too).
#
#   docker run --rm -p 1883:1883 -p 8080:8080 -v bridge-data:/data mqtt-bridge
#   docker run --rm mqtt-bridge --help            # arguments go to `mqtt-bridge`
#
# Every setting also comes from MQTT_BRIDGE_<NAME> environment variables (README.md, "Configuration").
# The image runs as the unprivileged user `bridge` (uid 10001); /data (data_dir) must be writable
# by it: a named volume is, a bind-mounted host directory needs `chown 10001:10001` first.
#
# Two stages: `build` makes the release exactly as `make dist` does (the sdist, and from it the
# wheel with the hot path compiled by mypyc, setup.py's COMPILED list; gcc is in this stage only)
# and the wheels of all its dependencies; the final stage installs that wheel, offline, into a
# virtual environment. No compiler, no build tools and no pip cache end up in the image.

ARG PYTHON_VERSION=3.11.13

################################################################################
FROM python:${PYTHON_VERSION}-slim-bookworm AS build

# A C compiler for mypyc. Without it the wheel would fail to build, rather than come out as the
# slower pure-Python package (MQTT_BRIDGE_COMPILE=0 builds that one on purpose). Not pinned:
# bookworm's gcc stays 12.2 for the release, while a pinned Debian revision disappears from the
# mirrors with its next security update and would break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# pypa/build, pinned: it builds the sdist and the wheel from it in isolated environments.
RUN pip install --no-cache-dir build==1.3.0
# Only what the release is built from: a change in tests/ or docs/ does not rebuild this layer.
COPY pyproject.toml setup.py MANIFEST.in README.md CHANGELOG.md LICENSE NOTICE ./
COPY bridge/ bridge/
COPY notify/ notify/
COPY spark/ spark/
# MQTT_BRIDGE_COMPILE=required: a compiler that fails stops the build instead of leaving the
# slower pure-Python wheel (setup.py). Then the dependencies' wheels beside it.
RUN MQTT_BRIDGE_COMPILE=required python -m build --outdir /dist . \
    && pip wheel --no-cache-dir --wheel-dir /wheels /dist/mqtt_bridge-*.whl

################################################################################
FROM python:${PYTHON_VERSION}-slim-bookworm

LABEL org.opencontainers.image.title="mqtt-bridge" \
      org.opencontainers.image.description="A clustered MQTT gateway over RocketMQ storage"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/mqtt-bridge \
    PATH=/opt/mqtt-bridge/bin:$PATH \
    MQTT_BRIDGE_DATA_DIR=/data \
    MQTT_BRIDGE_LISTEN=0.0.0.0:1883 \
    MQTT_BRIDGE_ALLOW_ANONYMOUS_PUBLIC=true \
    MQTT_BRIDGE_ADMIN_LISTEN=0.0.0.0:8080

# A container is reached through its published ports, so it listens on 0.0.0.0; outside a
# container a node without users stays on loopback unless allow_anonymous_public is set
# (docs/operations.md, "Hardening: safe defaults"). Give users (MQTT_BRIDGE_PASSWORD_FILE)
# before publishing port 1883 beyond this host: anonymous clients are then refused.

# The wheels are bind-mounted from the build stage, so they never become a layer of this image.
# --no-index: everything comes from /wheels, nothing from a registry at this point.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/mqtt-bridge \
    && /opt/mqtt-bridge/bin/pip install --no-cache-dir --no-index --find-links=/wheels \
        /wheels/mqtt_bridge-*.whl \
    && groupadd --system --gid 10001 bridge \
    && useradd --system --uid 10001 --gid bridge --no-log-init --no-create-home \
        --home-dir /data --shell /usr/sbin/nologin bridge \
    && mkdir -p /data \
    && chown bridge:bridge /data

# 1883 MQTT, 8883 MQTT over TLS, 8083 MQTT over WebSocket, 8084 secure WebSocket, 8080 admin API
# (/api/v1/..., /metrics), 18830 peer links between cluster nodes. Only the listeners that the
# settings turn on are open: listen (0.0.0.0:1883 in this image), tls_listen, ws_listen, wss_listen,
# admin_listen (0.0.0.0:8080 in this image), peer_listen (clustered nodes only).
EXPOSE 1883 8883 8083 8084 8080 18830

# data_dir: the embedded store's segments and snapshot (store=filelog), the RocketMQ store's local
# state, the generated admin token.
VOLUME ["/data"]
WORKDIR /data
# Numeric, so a runtime can check "not root" without the image's /etc/passwd (runAsNonRoot).
USER 10001:10001

# The admin API answers GET /api/v1/health while the process serves. The port is read from
# MQTT_BRIDGE_ADMIN_LISTEN, so a changed admin_listen port keeps the check working (it must stay
# reachable on 127.0.0.1, i.e. bound to 0.0.0.0 or 127.0.0.1). Python's urllib: no curl needed.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('MQTT_BRIDGE_ADMIN_LISTEN', '0.0.0.0:8080').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/api/v1/health', timeout=4)"]

# SIGTERM drains the node: it stops accepting, closes its clients (they reconnect through the
# balancer) and hands its persistent sessions to the other nodes. Give it time to do so
# (docker stop -t 30, compose stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["mqtt-bridge"]
