"""tracemq nameserver: keeps routes, brokers and subscriptions in Redis from the control topic."""
