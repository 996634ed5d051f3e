"""Small shared plumbing: atomic checkpoint I/O, input validation, seeding."""
