"""The event loop's job path: decode, the interceptor chain, a runner or the pool, deadlines."""
