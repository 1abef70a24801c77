#!/bin/sh
# Writes server.properties from the KAFKA_* variables as apache/kafka does (KAFKA_LOG_DIRS is
# log.dirs: "_" is ".", "__" is "_", "___" is "-"), formats the log dir once, runs the broker.
set -eu
config=/var/lib/kafka/server.properties
: "${CLUSTER_ID:=5L6g3nShT-eMCtK--X86sw}"
: "${KAFKA_LOG_DIRS:=/var/lib/kafka/data}"
export KAFKA_LOG_DIRS

env | sed -n 's/^KAFKA_\([A-Z0-9_]*\)=\(.*\)$/\1 \2/p' | while read -r name value; do
    case "$name" in
        HEAP_OPTS | OPTS | JVM_PERFORMANCE_OPTS | LOG4J_OPTS | VERSION) continue ;;
    esac
    key=$(printf '%s' "$name" | tr 'A-Z' 'a-z' | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
    printf '%s=%s\n' "$key" "$value"
done > "$config"

classpath='/opt/kafka/libs/*'
log4j="-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties"
# shellcheck disable=SC2086  # KAFKA_*_OPTS hold several JVM options
java -XX:TieredStopAtLevel=1 $log4j -cp "$classpath" kafka.tools.StorageTool \
    format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$config"
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G} ${KAFKA_OPTS:-} $log4j -cp "$classpath" \
    kafka.Kafka "$config"
