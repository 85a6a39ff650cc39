"""Capacity planning: sweeps, executors, capacity search, plans, deployments, clusters, routers, pricing."""
