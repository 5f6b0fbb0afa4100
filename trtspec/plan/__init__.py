"""Deployment planning without weights: GPU table, real-model architectures, memory planner."""
