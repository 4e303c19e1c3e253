"""The nemesis: private RabbitMQ and PostgreSQL servers for fault injection to stop and restart."""
