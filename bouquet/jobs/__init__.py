"""Offline jobs: batch embedding of files (in process, or across a Ray cluster)."""
