"""Config authority and config sync (architecture §3-§9): seed loading for now."""
