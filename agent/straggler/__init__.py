"""straggler: find the straggler node of a distributed GPU training job."""
__version__ = "0.1.0"
