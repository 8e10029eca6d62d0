"""The adapter registry: content-addressed versions, names per tenant, publishing, visibility and collection."""
