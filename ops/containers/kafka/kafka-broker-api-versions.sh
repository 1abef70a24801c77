#!/bin/sh
# The tool of the same name in Kafka's bin/, which docker-compose.yml's healthcheck runs.
exec java -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
    -cp '/opt/kafka/libs/*' org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
