"""examples/web_enqueue.py: 202 with the job's id while Kafka answers, 503 with Retry-After once
the delivery timeout passed without an answer (nothing listens on the address), 400 for a body
it cannot make a job of."""

from __future__ import annotations

from confluent_kafka import Consumer
from examples.web_enqueue import RETRY_AFTER_S, make_web
from starlette.testclient import TestClient

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics


def test_a_signup_enqueues_its_email_and_answers_202(settings: Settings) -> None:
    apply_topics(settings)
    app = Pipeline(settings)

    @app.job("email.send")
    def send(to: str, subject: str) -> None: ...

    try:
        with TestClient(make_web(app)) as client:
            response = client.post("/signup", json={"email": "ann@example.com"})
        assert response.status_code == 202, response.text
        job_id = response.json()["job_id"]
    finally:
        app.close()
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.check",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([f"{settings.namespace}.jobs.default"])
        message = None
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                break
        assert message is not None
        assert app.codec.decode(message.value() or b"").id == job_id
    finally:
        consumer.close()


def test_kafka_unreachable_answers_503_with_retry_after() -> None:
    settings = Settings(bootstrap_servers="127.0.0.1:1", producer={"delivery_timeout_s": 1.0})
    app = Pipeline(settings)
    with TestClient(make_web(app)) as client:
        response = client.post("/signup", json={"email": "ann@example.com"})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == str(RETRY_AFTER_S)
    assert "unavailable" in response.json()["error"]
    app.close(5)  # the job that failed was told to the client: nothing is left to report


def test_a_body_it_cannot_make_a_job_of_answers_400_and_sends_nothing() -> None:
    """It answered 500 Internal Server Error."""
    app = Pipeline(Settings(bootstrap_servers="127.0.0.1:1"))

    @app.job("email.send")
    def send(to: str, subject: str) -> None: ...

    bodies = {
        "not JSON": {"content": b"{not json"},
        "not an object": {"json": ["ann@example.com"]},
        "no email": {"json": {"mail": "ann@example.com"}},
        "not a string": {"json": {"email": 42}},
    }
    try:
        with TestClient(make_web(app), raise_server_exceptions=False) as client:
            for what, body in bodies.items():
                response = client.post("/signup", **body)  # type: ignore[arg-type]
                assert response.status_code == 400, (what, response.text)
                assert response.json()["error"], what
        app.flush(1)  # raises if a job was handed to the producer (Kafka never answers here)
    finally:
        app.close(1)
