# The kopf operator. Build from the repository root:
#   docker build -f images/operator.Dockerfile -t durable-streams-operator:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[operator]'

FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 operator && useradd --uid 10001 --gid 10001 --no-create-home operator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'durable-streams-py[operator]' && rm -rf /wheels
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["tini", "--", "durable-streams-operator"]
