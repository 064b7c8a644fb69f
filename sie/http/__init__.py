"""Starlette apps for the HTTP roles, and the hypercorn server runner."""
