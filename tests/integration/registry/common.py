"""Names shared by the registry tests and the application their workers run."""

from __future__ import annotations

from pathlib import Path

RECORD_ENV = "REGISTRY_TEST_RECORD"
"""The file each run of the test application appends its JSON line to."""
INVOICE_SCHEMA = Path(__file__).with_name("invoice.avsc")
