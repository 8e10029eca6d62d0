"""Tests of serving.usage: the usage store, the limiter and the Tenancy facade."""
