# The stream server. Build from the repository root:
#   docker build -f images/server.Dockerfile -t durable-streams-py:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[server]'

FROM python:3.11-slim
# tini forwards SIGTERM to the server, which finishes in-flight batches and
# runs a final checkpoint before exiting.
RUN apt-get update && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 streams && useradd --uid 10001 --gid 10001 --no-create-home streams \
    && mkdir /data && chown streams:streams /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'durable-streams-py[server]' && rm -rf /wheels
USER 10001:10001
ENV DS_HOST=0.0.0.0 DS_DATA_DIR=/data DS_LOG_FORMAT=json
VOLUME ["/data"]
EXPOSE 4437
ENTRYPOINT ["tini", "--", "durable-streams-server"]
CMD ["serve"]
