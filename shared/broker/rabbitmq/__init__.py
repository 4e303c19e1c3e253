"""The RabbitMQ adapter of the broker port (shared/broker/port.py), on aio-pika."""

from shared.broker.rabbitmq.adapter import RabbitConnection, connect

__all__ = ["RabbitConnection", "connect"]
