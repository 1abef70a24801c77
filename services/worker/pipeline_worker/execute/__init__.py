"""The event loop's job path: decode, start on a runner or the pool, deadlines."""
