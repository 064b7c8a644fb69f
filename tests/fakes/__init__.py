"""Test doubles for engines that cannot run on the CPU test machines (vLLM)."""
