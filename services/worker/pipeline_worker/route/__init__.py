"""Where a job goes when it ends: endings, failure policy, dedup, events, hooks."""
