"""TextArena games as envhub environments."""
