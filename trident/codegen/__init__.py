"""Codegen: the one writer of C. A specialization becomes the C source of its Specialization
Cache Module, through the templates/ folder's Jinja2 templates."""
