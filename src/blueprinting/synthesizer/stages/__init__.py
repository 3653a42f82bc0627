"""IR stages: each holds values (ir.py) and the passes that build and check them."""
