#!/bin/bash
# The Spark image's entrypoint: the driver/executor dispatch of Apache Spark's Kubernetes
# entrypoint (resource-managers/kubernetes/docker/src/main/dockerfiles/spark/entrypoint.sh,
# Apache-2.0), reduced to what this image needs; any other command runs as given.
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
