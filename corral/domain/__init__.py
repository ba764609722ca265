"""Domain code shared by the roles: pure libraries with no I/O of their own."""
