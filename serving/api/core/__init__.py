"""The API's core: one path from request to generation (resolve the adapter, build the prompt,
admit, start, stream, meter), shared by every wing; it imports no wing."""
