"""The OpenAI wing: /v1/chat/completions, /v1/completions, /v1/responses and /v1/models over the core."""
