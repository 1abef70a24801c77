"""docker-compose.yml on Podman, with locally built stand-ins for the images of Docker Hub.

``python -m ops.containers build`` builds a Debian base with Python 3.11 (debootstrap from
Debian's mirror), Kafka on it from the Maven Central jars, Prometheus from Debian's package, and
the project's image from its Dockerfile on that base; ``python -m ops.containers compose ...``
runs podman-compose on docker-compose.yml with those images. ``make test-containers`` builds
them and brings the stack up (tests/containers/).
"""
