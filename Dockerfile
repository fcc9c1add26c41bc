# context-proxy container image.
#   docker build -t context-proxy .
#   docker run -p 8000:8000 -e CONTEXT_PROXY_UPSTREAM_URL=https://api.openai.com/v1 context-proxy
# Build and start steps live in deploy/container/{install,start}.sh, which the tests run in a
# clean virtual environment (tests/test_packaging.py): keep this file a thin wrapper around them.

# --- build stage: a virtual environment with the project and tiktoken's encoding files --------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 VENV_DIR=/opt/context-proxy
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY storage ./storage
COPY deploy/container ./deploy/container
RUN sh deploy/container/install.sh /src

# --- runtime stage: the environment only, run as a non-root user --------------------------------
FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 context-proxy \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/context-proxy --create-home context-proxy
COPY --from=build /opt/context-proxy /opt/context-proxy
COPY deploy/container/start.sh /usr/local/bin/context-proxy-start
ENV VENV_DIR=/opt/context-proxy \
    PATH=/opt/context-proxy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TIKTOKEN_CACHE_DIR=/opt/context-proxy/tiktoken \
    CONTEXT_PROXY_TIKTOKEN_CACHE_DIR=/opt/context-proxy/tiktoken \
    CONTEXT_PROXY_HOST=0.0.0.0 \
    CONTEXT_PROXY_PORT=8000 \
    CONTEXT_PROXY_DATABASE_URL=sqlite:////var/lib/context-proxy/context-proxy.db \
    CONTEXT_PROXY_LOG_FORMAT=json
USER 10001:10001
WORKDIR /var/lib/context-proxy
VOLUME ["/var/lib/context-proxy"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CONTEXT_PROXY_PORT', '8000'), timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/context-proxy-start"]
CMD ["serve"]
