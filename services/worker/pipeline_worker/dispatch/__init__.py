"""Which job starts next: priorities, key order, tenant fairness, type and tenant limits, holds."""
