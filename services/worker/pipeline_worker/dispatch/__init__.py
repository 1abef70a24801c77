"""Which queued job starts next: priorities, key order, type limits, holds."""
