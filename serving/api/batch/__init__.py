"""The batch wing: OpenAI's Files and Batch API over the batch store, and queued items run through the app."""
