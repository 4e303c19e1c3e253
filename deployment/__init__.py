"""Deployment files generated from the code: RabbitMQ definitions, the MongoDB init script, the
settings file. `orderflow deploy write` regenerates every committed one; unit tests fail when a
committed file differs from what the code generates."""
