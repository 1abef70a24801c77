"""Getting past trouble: poison-pill detection and quarantine, the retry relay."""
