"""The application the cron tests run the scheduler and ``pipeline schedules add --app`` with."""

from __future__ import annotations

from pipeline import Pipeline

app = Pipeline()


@app.job("cron.declared", priority="high", max_attempts=2)
def declared() -> None:
    """A type whose declared options every cron fire of it takes unless its schedule says."""


@app.job("report.build")
def build_report(kind: str) -> None:
    """A type with a required argument, to check schedule payloads against."""


app.schedule("declared-in-code", cron="* * * * * */2", job_type="cron.declared")
