"""Typed strategies, models and the laws that relate them."""
