"""Asynchronous batches: a durable store of jobs and their items, and the feeder that runs them."""
