"""Serving: config, model, engine, API, batch and deploy."""
