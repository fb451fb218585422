"""TextWorld text adventures as envhub environments."""
