# syntax=docker/dockerfile:1.7
# The Spark job image: Spark from the pyspark wheel (the same build the tests run),
# Python 3.11 like the server image (Apache's Spark images ship Ubuntu 22.04's 3.10, below the
# project's floor; bookworm packages OpenJDK 17, the Java the tests run with),
# this project's `spark` extra, and the Spark-on-Kubernetes entrypoint.
#
#   docker build -f images/spark.Dockerfile -t durable-streams-spark:0.1.0 .
#
# Job files: local:///opt/stream_spark/jobs/stats.py and .../extract.py
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG SPARK_UID=185
# slim images drop /usr/share/man, which the JRE's postinst needs for its alternatives.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps bash libnss-wrapper; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid "${SPARK_UID}" spark; \
    useradd --system --uid "${SPARK_UID}" --gid spark --home-dir /opt/spark/work-dir --no-create-home spark

COPY pyproject.toml README.md /src/
COPY server /src/server
COPY operator /src/operator
# orjson: the stream metadata decoder the reader shares with the server.
RUN set -eux; \
    pip install --no-cache-dir "/src[spark]" "orjson>=3.10"; \
    rm -rf /src; \
    site="$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"; \
    mkdir -p /opt/spark/work-dir /opt/spark/conf; \
    ln -s "${site}/bin" /opt/spark/bin; \
    ln -s "${site}/jars" /opt/spark/jars; \
    ln -s "${site}/sbin" /opt/spark/sbin; \
    ln -s "$(python -c 'import os, stream_spark; print(os.path.dirname(stream_spark.__file__))')" /opt/stream_spark; \
    chown -R spark:spark /opt/spark/work-dir; \
    chmod g+w /opt/spark/work-dir

# The driver/executor dispatch of Apache Spark's Kubernetes entrypoint
# (resource-managers/kubernetes/docker/src/main/dockerfiles/spark/entrypoint.sh,
# Apache-2.0), reduced to what this image needs.
COPY --chmod=0755 <<"EOF" /opt/entrypoint.sh
#!/bin/bash
set -eo pipefail
if ! getent passwd "$(id -u)" &> /dev/null; then
  for wrapper in {/usr,}/lib{/*,}/libnss_wrapper.so; do
    if [ -s "$wrapper" ]; then
      NSS_WRAPPER_PASSWD="$(mktemp)"; NSS_WRAPPER_GROUP="$(mktemp)"
      export LD_PRELOAD="$wrapper" NSS_WRAPPER_PASSWD NSS_WRAPPER_GROUP
      printf 'spark:x:%s:%s:anonymous uid:%s:/bin/false\n' "$(id -u)" "$(id -g)" "$SPARK_HOME" > "$NSS_WRAPPER_PASSWD"
      printf 'spark:x:%s:\n' "$(id -g)" > "$NSS_WRAPPER_GROUP"
      break
    fi
  done
fi
JAVA_HOME="${JAVA_HOME:-$(java -XshowSettings:properties -version 2>&1 > /dev/null | awk '/java.home/ {print $3}')}"
SPARK_CLASSPATH="${SPARK_CONF_DIR:-$SPARK_HOME/conf}:$SPARK_CLASSPATH:${SPARK_HOME}/jars/*:$PWD"
for v in "${!SPARK_JAVA_OPT_@}"; do SPARK_EXECUTOR_JAVA_OPTS+=( "${!v}" ); done
case "$1" in
  driver)
    shift 1
    exec /usr/bin/tini -s -- "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift 1
    exec /usr/bin/tini -s -- "${JAVA_HOME}/bin/java" "${SPARK_EXECUTOR_JAVA_OPTS[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_CLASSPATH:$SPARK_DIST_CLASSPATH" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  *)
    exec "$@"
    ;;
esac
EOF

ENV SPARK_HOME=/opt/spark \
    PYSPARK_PYTHON=python3 \
    PYSPARK_DRIVER_PYTHON=python3 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/spark/work-dir
USER ${SPARK_UID}
ENTRYPOINT ["/opt/entrypoint.sh"]
