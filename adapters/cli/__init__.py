"""`loraserve adapters ...`: the adapter command line and its HTTP client for a running server."""
