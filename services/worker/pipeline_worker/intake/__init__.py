"""The consumer thread: polling, rebalances, marks and keys read back, pausing, burst, shutdown."""
