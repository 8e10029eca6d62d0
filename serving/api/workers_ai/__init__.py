"""The Workers AI wing: POST /ai/run/{model}, a generation or a queued batch of them, over the core."""
