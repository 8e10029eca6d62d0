"""The engine: continuous batching of mixed-adapter requests over the model runtime."""
