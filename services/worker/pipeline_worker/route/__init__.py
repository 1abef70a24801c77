"""A job's end: endings, follow-ups, failure policy, moves fit to size, dedup, events, hooks."""
