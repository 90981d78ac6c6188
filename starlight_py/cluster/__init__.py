"""What makes N proxies one broker beyond shared metadata: the proxy registry, the
SubscriptionCleaner and its leader election."""
